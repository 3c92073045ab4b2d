"""Graph breaks in loops, inlined callees, modules and closures; training through several
graphs; fullgraph; generators."""
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


def _helper_prints(t):
    u = t * 2
    print("helper")
    return u + 1


def _helper_nested(t):
    return _helper_prints(t.sin()) * 3


# ---------------------------------------------------------------- loops
@case(4, 3)  # resumes inside the loop: the prefix, then one graph per break (tests/capture/test_loop_breaks.py)
def print_in_a_for_loop(x):
    y = x + 1
    for i in range(3):
        y = y * 2
        print("step", i)
    return y - 1


@case(1, 1)  # a while loop: the rest of the frame runs eagerly
def break_in_a_while_loop(x):
    n = 0
    y = x.cos()
    while n < 3:
        kiln.graph_break()
        y = y + n
        n += 1
    return y


@case(2, 1)
def break_after_an_unrolled_loop(x):
    for _ in range(3):
        x = x * 1.5
    print("after loop")
    return x.sum(0)


# ---------------------------------------------------------------- inlined callees
@case(4, 2)  # prefix, the helper before/after its print (compiled on its own, so its break
def break_inside_a_helper(x):  # is counted again), the rest
    y = x - 1
    z = _helper_prints(y)
    return z * y


@case(5, 3)  # each callee on the way is compiled on its own and breaks at the same print
def break_two_calls_deep(x):
    return _helper_nested(x) + x


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        kiln.graph_break()
        return torch.relu(h)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.a(x)).sum(1)


_NET = Net()


@case(4, 3)  # Block before/after, Net.forward's rest, and the caller's (empty) rest
def break_inside_a_submodule(x):
    return _NET(x)


# ---------------------------------------------------------------- closures
def _make_closure():
    scale = torch.tensor(3.0)
    count = [0]

    def fn(x):
        y = x * scale
        kiln.graph_break()
        count[0] += 0  # reads the free variable after the break
        return y + len(count)
    return fn


closure_breaks = case(2, 1)(_make_closure())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,args,graphs,breaks,specializes", CASES)
def test_break(fn, args, graphs, breaks, specializes, backend, capsys):
    check_break(fn, args, capsys, backend, graphs=graphs, breaks=breaks, specializes=specializes)


# ---------------------------------------------------------------- training across breaks
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_flows_through_every_graph(backend):
    torch.manual_seed(0)
    net = Net()

    def loss_fn(model, x):
        h = model(x)
        if h.sum() > -1e9:  # a data-dependent branch: one more graph
            h = h * 2
        return (h ** 2).mean()

    x = torch.randn(4, 8, requires_grad=True)
    expected = loss_fn(net, x)
    expected.backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    net.zero_grad()
    x.grad = None
    compiled = kiln.compile(loss_fn, backend=backend)
    loss = compiled(net, x)
    assert loss.requires_grad
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for got, want in zip([p.grad for p in net.parameters()] + [x.grad], grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the break inside Block, met by loss_fn, Net.forward and Block.forward (each compiled on its
    # own), and the data-dependent branch in loss_fn's resume function
    assert kiln.stats()["graph_breaks"] == 4


def test_fullgraph_names_the_reason_and_line():
    def fn(x):
        y = x + 1
        print("no")
        return y

    with pytest.raises(kiln.GraphBreakError, match=r"call to print.*test_resume_more.py:\d+: print\(\"no\"\)"):
        kiln.compile(fn, fullgraph=True, backend="eager")(torch.randn(3))


def test_explain_reports_each_break():
    def fn(x):
        y = x * 2
        print("one")
        z = y.item() if y.numel() == 1 else 0.0
        return y + z

    e = kiln.explain(fn, backend="eager")(torch.randn(1))
    assert (e.graph_count, e.graph_break_count) == (2, 2), str(e)
    assert [b.source_line for b in e.break_reasons] == ['print("one")',
                                                        "z = y.item() if y.numel() == 1 else 0.0"]
    assert all(b.filename == __file__ for b in e.break_reasons)
    assert "Break 1: call to print" in str(e)


def test_generator_runs_eagerly():
    def gen(x):
        yield x + 1
        yield x * 2

    compiled = kiln.compile(gen, backend="eager")
    x = torch.randn(3)
    got = list(compiled(x))
    torch.testing.assert_close(got, list(gen(x)))
    assert kiln.stats()["frames_compiled"] == 0


def test_resume_recompiles_on_a_new_shape():
    def fn(x):
        y = x.exp()
        kiln.graph_break()
        return y.sum(0)

    compiled = kiln.compile(fn, backend="eager", dynamic=False)
    for shape in [(3, 4), (5, 4), (3, 4)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x), fn(x))
    stats = kiln.stats()
    assert stats["frames_compiled"] == 4 and stats["recompiles"] == 2, stats


# ---------------------------------------------------------------- autocast regions
def _break_in_autocast(x, w):
    y = x + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = y @ w
        print("inside", torch.is_autocast_enabled("cpu"), z.dtype)
        z = z @ w
    return z.float() + y, z.dtype


def _break_in_autocast_under_no_grad(x, w):
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = x @ w
            kiln.graph_break()
            z = torch.relu(z @ w)
    return z, torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_break_in_autocast, _break_in_autocast_under_no_grad])
def test_break_inside_autocast_resumes_in_the_region(fn, backend, capsys):
    """The glue enters the region for real before the breaking call (print sees autocast on)
    and the resume function runs inside it (ambient autocast, guarded); the with-exit is
    called for real (one more break), so autocast is off again after the call."""
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        x, w = randn(4, 8, grad=True), randn(8, 8)
        capsys.readouterr()
        expected = fn(x, w)
        eager_text = capsys.readouterr().out
        actual = compiled(x, w)
        assert capsys.readouterr().out == eager_text
        assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
        assert actual[0].dtype == expected[0].dtype
        assert actual[0].requires_grad == expected[0].requires_grad
        torch.testing.assert_close(actual[0], expected[0], rtol=2e-2, atol=2e-2)  # bf16 matmuls
        assert actual[1:] == expected[1:]
    stats = kiln.stats()
    assert stats["recompiles"] == 0 and stats["fallbacks"] == 0, stats
    eager = [c.eager_reason for c in kiln.api._CODE_CACHES.values() if c.eager_reason]
    assert not eager, eager  # the function was resumed, not run eagerly as a whole
    explained = kiln.explain(fn, backend="eager")(randn(4, 8), randn(8, 8))
    capsys.readouterr()
    assert (explained.graph_count, explained.graph_break_count) == (3, 2), explained
