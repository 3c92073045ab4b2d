"""Graph breaks with resume functions: each function breaks, and must match eager (outputs,
printed text, appended lists), cache its frames, and report its graphs and breaks."""
import zlib

import pytest
import torch

import kiln
from tests.capture.resume_helpers import BACKENDS, check_break, randn

CASES = []


def case(graphs, breaks, args=lambda: (randn(4, 8),), specializes=False):
    def deco(fn):
        CASES.append(pytest.param(fn, args, graphs, breaks, specializes, id=fn.__name__))
        return fn
    return deco


# ---------------------------------------------------------------- print and friends
@case(2, 1)
def print_between_ops(x):
    y = x.sin() + 1
    print("between")
    return y * 2


@case(2, 1)
def print_a_shape(x):
    y = x.t() + 0  # (a view live across a break makes the whole function eager: mutation.py)
    print("shape", y.shape, y.dtype)
    return y.cos()


@case(1, 1)
def print_first(x):
    print("first")
    return x * 3


@case(2, 1)
def print_last(x):
    y = x.exp()
    print("last")
    return y


@case(2, 1)
def print_with_keywords(x):
    y = x - 1
    print("a", "b", y.shape, sep="|", end="!\n")
    return y.abs()


@case(2, 1)
def print_inside_a_call_argument(x):
    y = x * 2
    return torch.cat([y, torch.full((1, 8), float(len(str(print("nested")))))])


@case(3, 2)
def two_prints(x):
    a = x + 1
    print("one")
    b = a * a
    print("two")
    return b - a


# ---------------------------------------------------------------- kiln.graph_break
@case(2, 1)
def explicit_break(x):
    y = torch.relu(x)
    kiln.graph_break()
    return y.sum(1)


@case(3, 2)
def explicit_break_twice(x):
    y = x * 2
    kiln.graph_break()
    z = y + x
    kiln.graph_break()
    return z, y


@case(2, 1, args=lambda: (randn(4, 8), randn(8)))
def break_keeps_many_locals(x, b):
    scale, name, dims = 0.5, "s", (1, 0)
    y = x * scale + b
    kiln.graph_break()
    return {"out": y.permute(*dims), name: y.sum()}


# ---------------------------------------------------------------- data-dependent branches
@case(2, 1, args=lambda: (torch.randn(4, 8) + 5,))
def branch_taken(x):
    y = x.sin()
    if x.sum() > 0:
        y = y + 1
    return y * 2


@case(2, 1, args=lambda: (torch.randn(4, 8) - 5,))
def branch_not_taken(x):
    y = x.sin()
    if x.sum() > 0:
        return y + 1
    return y - 1


@case(2, 1, args=lambda: (torch.randn(6),))
def branch_either_way(x):
    y = x * 3
    if (y > 0).any():
        out = y.relu()
    else:
        out = y.neg()
    return out + x


@case(2, 1, args=lambda: (torch.randn(3) + 10,))
def while_condition_on_data_is_a_loop(x):
    z = x + 1
    if z.max() < 100:
        z = z * 2
    return z


# ---------------------------------------------------------------- .item(), .tolist(), .numpy()
@case(2, 1, specializes=True)
def item_in_python_arithmetic(x):
    s = x.sum().item()
    return x * round(s, 1)


@case(2, 1, specializes=True)
def tolist_length(x):
    vals = x.sum(0).tolist()
    return x + len(vals)


@case(3, 2)  # .numpy(), then arr.shape on the array in the resume function
def numpy_round_trip(x):
    y = x * 2
    arr = y.numpy()
    return y + 1, arr.shape


@case(2, 2, specializes=True)  # .item(), then print in the resume function
def item_formatted(x):
    y = x.abs().mean()
    print(f"{y.item():.1f}"[:1])
    return x / 2


# ---------------------------------------------------------------- unknown calls
@case(2, 1)
def c_extension_call(x):
    y = x.tanh()
    k = zlib.crc32(b"kiln") % 7
    return y * k


@case(2, 1, args=lambda: (torch.randn(6),), specializes=True)
def data_dependent_shape(x):
    y = x * 2
    idx = torch.nonzero(y > 0)
    return y.sum() + idx.sum()


@kiln.disable
def _not_traced(t):
    return t * 10


@case(2, 1)
def disabled_call(x):
    y = x + 1
    z = _not_traced(y)
    return z - y


@case(2, 1)
def disabled_call_on_the_stack(x):
    y = x.cos()
    return torch.cat([y, _not_traced(y)], 0)


@case(1, 1)  # nothing before the break
def disabled_call_unpacked(x):
    a, b = _not_traced(x).chunk(2, 1)
    return a * b


# ---------------------------------------------------------------- side effects and state
@case(2, 1)
def list_built_before_the_break(x):
    out = [x + 1]
    print("mid")
    out.append(x * 2)
    return out


@case(2, 1, args=lambda: (randn(4, 8), []))
def appends_to_an_input_list(x, log):
    y = x * 2
    print("logged")
    log.append("done")
    return y


@case(2, 1)
def dict_built_before_the_break(x):
    d = {"a": x.sin()}
    kiln.graph_break()
    d["b"] = d["a"] + 1
    return d


@case(2, 1, args=lambda: (randn(4, 8), 3))
def python_scalar_argument(x, n):
    y = x * n
    kiln.graph_break()
    return y + n


@case(2, 1, args=lambda: (randn(4, 8), randn(4, 8)))
def varargs(*ts):
    total = ts[0] + ts[1]
    kiln.graph_break()
    return total * len(ts)


@case(2, 1)
def keyword_only_default(x, *, scale=2.0):
    y = x * scale
    kiln.graph_break()
    return y + scale


@case(2, 1)
def inside_a_try_block(x):
    try:
        y = x + 1
        print("in try")
        z = y * 2
    except RuntimeError:
        z = x
    return z


# ---------------------------------------------------------------- with blocks and grad mode
@case(2, 1, args=lambda: (randn(4, 8, grad=True),))
def break_inside_no_grad(x):
    y = x * 2
    with torch.no_grad():
        z = x + 1
        print("grad", torch.is_grad_enabled())
        z = z * 3
    return y + z


@case(2, 1, args=lambda: (randn(4, 8, grad=True),))
def break_inside_enable_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
            kiln.graph_break()
            y = y.sin()
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,args,graphs,breaks,specializes", CASES)
def test_break(fn, args, graphs, breaks, specializes, backend, capsys):
    check_break(fn, args, capsys, backend, graphs=graphs, breaks=breaks, specializes=specializes)


def test_case_count():
    assert len(CASES) >= 30
