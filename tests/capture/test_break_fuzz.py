"""Graph breaks at varied stack depths: each function calls something capture cannot trace
(``untraced.cummax``, ``print``, ``kiln.graph_break()``, ``.item()``, ``.tolist()``, ...) in the
middle of an expression, so the glue must rebuild a stack that holds other values (a callee
and its first arguments, the left operand of a binary op, a half-built tuple, dict or
comprehension, a with-block's exit, ...), and the resume function may break again.

Every function runs under backends eager and kiln and must match plain eager (outputs,
printed text, inputs), twice on fresh inputs and once more on the same ones (a cache hit);
explain must report at least the expected breaks, nothing may fall back to whole-function
eager through an internal error, and nothing may recompile unless the case specializes on
data (``.item()``/``.tolist()`` values feed later Python code).
"""
import contextlib

import pytest
import torch

import kiln
from kiln import api
from tests.capture.resume_helpers import BACKENDS, _clone, run_both

CASES = []


def case(min_breaks=1, args=lambda: (torch.randn(4, 5),), specializes=False):
    def deco(fn):
        CASES.append(pytest.param(fn, args, min_breaks, specializes, id=fn.__name__))
        return fn
    return deco


def helper_breaks(t):
    u = t.cos()
    kiln.graph_break()
    return u + 1


class Printer(torch.nn.Module):
    def forward(self, t):
        print("module", t.shape)
        return t.relu()


PRINTER = Printer()


class untraced:
    """torch.cummax/cummin outside capture: since fallback nodes take several results they are
    captured (one graph), so each call here is a graph break at the call site."""
    cummax = staticmethod(kiln.disable(torch.cummax))
    cummin = staticmethod(kiln.disable(torch.cummin))


class Box:
    def __init__(self, t):
        self.t = t * 2


class Scale:
    """A context manager written in Python: its __enter__/__exit__ are traced."""
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return 3.0

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


# ---------------------------------------------------------------- results used by subscripts
@case()
def cummax_then_subscript(x):
    return untraced.cummax(x, 0)[0]


@case()
def cummax_field_then_op(x):
    return untraced.cummax(x, 1).indices * 2 + x


@case(2)
def cummax_of_cummax(x):
    return untraced.cummax(untraced.cummax(x, 0).values, 1).values


@case()
def unpack_a_break_result(x):
    values, indices = untraced.cummin(x, 0)
    return values - indices


@case()
def method_chain_through_a_break(x):
    return untraced.cummax(x.sin(), 0).values.cos().sum(1)


# ---------------------------------------------------------------- inside a call's arguments
@case()
def break_in_a_call_argument(x):
    return torch.add(x, untraced.cummax(x, 1).values, alpha=2)


@case()
def break_in_a_list_argument(x):
    return torch.cat([x, untraced.cummax(x, 0).values, x * 3])


@case()
def break_in_a_method_argument(x):
    return x.mul(2).add(untraced.cummin(x, 1).values)


@case()
def print_as_a_keyword_argument(x):
    return torch.sum(x * 2, dim=0 if print("kw") is None else 1)


@case(2)
def inlined_callee_breaks_twice_in_an_expression(x):
    return helper_breaks(x) * helper_breaks(x + 1)


@case()
def module_printing_in_an_expression(x):
    return x + PRINTER(x * 2)


# ---------------------------------------------------------------- binary ops and comparisons
@case(specializes=True)
def item_as_a_right_operand(x):
    y = x * 2
    return y + x.sum().item()


@case(specializes=True)
def item_as_a_left_operand(x):
    return x.abs().max().item() * x - 1


@case(specializes=True)
def tolist_in_a_comparison_chain(x):
    return x * 2 if 0 < len(x.tolist()) <= 10 else x


@case()
def data_dependent_branch_in_an_expression(x):
    y = x * 2 + (x if x.sum() > 0 else -x)
    return y.exp()


@case(specializes=True)
def item_in_a_subscript(x):
    return x[int(x.argmax().item()) % 4] * 3


@case()
def print_in_a_slice(x):
    return x[:2 + (print("slice") or 0)] + 1


# ---------------------------------------------------------------- containers being built
@case()
def print_in_a_tuple(x):
    return (x.sin(), print("in a tuple"), x.cos())


@case()
def break_in_a_dict(x):
    return {"a": x + 1, "b": untraced.cummax(x, 0)[1], "c": x * 3}


@case(specializes=True)
def tolist_in_a_return_tuple(x):
    return x.sin(), x.tolist()


@case()
def append_around_a_break(x):
    out = [x.sin()]
    out.append(untraced.cummax(x, 0).values)
    out.append(x * 2)
    return out


@case()
def print_in_a_list_comprehension(x):
    return [t * 2 for t in (x, x + 1) if print("item") is None]


@case()
def break_in_a_generator_expression(x):
    return sum(t.sum(0) for t in (x, untraced.cummax(x, 0).values))


@case()
def structseq_live_across_a_break(x):
    r = torch.max(x, 1)
    print("between")
    return r.values + r.indices, r


@case()
def object_made_before_a_break(x):
    box = Box(x.sin())
    kiln.graph_break()
    return box.t + 1


@case()
def lambda_made_before_a_break(x):
    f = lambda t, k=2: t * k  # noqa: E731
    kiln.graph_break()
    return f(x) + f(x, k=3)


@case(specializes=True)
def numpy_in_an_expression(x):
    return x + torch.from_numpy(x.numpy() * 2)


# ---------------------------------------------------------------- with blocks and loops
@case(args=lambda: (torch.randn(4, 5), []))
def print_inside_a_python_context_manager(x, log):
    with Scale(log) as k:
        y = x * k
        print("inside")
    return y - 1

@case(args=lambda: (torch.randn(4, 5, requires_grad=True),))
def cummax_inside_no_grad(x):
    y = x * 2
    with torch.no_grad():
        z = y + untraced.cummax(x, 0).values
    return y * z


@case()
def print_inside_a_null_context(x):
    with contextlib.nullcontext():
        y = x + 1
        print("inside")
    return y * 2


@case()
def break_inside_a_loop(x):
    for _ in range(2):
        x = x + untraced.cummax(x, 0).values
    return x


@case()
def break_inside_try_finally(x):
    try:
        y = x * 2
        kiln.graph_break()
    finally:
        y = y + 1
    return y


# ---------------------------------------------------------------- several breaks
@case(2)
def two_prints_in_a_row(x):
    print("a")
    print("b")
    return x + 1


@case(2)
def two_graph_breaks_between_ops(x):
    y = x.sin()
    kiln.graph_break()
    kiln.graph_break()
    return y * 2


@case(2)
def lambda_printing_in_a_binary_op(x):
    return (lambda t: print("l") or t)(x) * (lambda t: print("m") or t)(x + 1)


@case(specializes=True)
def item_then_print_then_op(x):
    n = x.max().item()
    print("max", round(n, 3))
    return x / n


@case()
def format_a_shape_at_a_break(x):
    print(f"{x.shape[0]}x{x.shape[1]}", end="\n")
    return x.cos()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,args,min_breaks,specializes", CASES)
def test_break_fuzz(fn, args, min_breaks, specializes, backend, capsys):
    compiled = kiln.compile(fn, backend=backend)
    run_both(fn, compiled, args(), capsys)
    first = kiln.stats()["recompiles"]  # a break inside a loop: one entry per distinct iteration
    again = args()
    run_both(fn, compiled, again, capsys)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0, stats
    if not specializes:
        assert stats["recompiles"] == first, stats
    eager = {c: cache.eager_reason for c, cache in api._CODE_CACHES.items()
             if cache.eager_reason and "runs as plain Python" not in cache.eager_reason}
    # every break resumed; no function gave up on compiling (a tail with no tensor op that was
    # handed new Python values runs as plain Python: the same program, nothing to compile)
    assert not eager, eager
    before = stats["frames_compiled"]
    run_both(fn, compiled, again, capsys)  # the same inputs: every frame is a cache hit
    stats = kiln.stats()
    assert stats["frames_compiled"] == before and stats["cache_hits"] > 0, stats
    if backend == "eager":
        explained = kiln.explain(fn, backend="eager")(*_clone(args()))
        capsys.readouterr()
        assert explained.graph_break_count >= min_breaks, explained
        for b in explained.break_reasons:
            assert b.reason and b.filename and b.lineno, b


def test_case_count():
    assert len(CASES) >= 30
