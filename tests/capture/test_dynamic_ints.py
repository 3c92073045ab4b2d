"""Automatic dynamic for Python ints: an int argument or a module's int attribute whose value
changes between calls is traced as a symbol on the next compile (read by the guard, passed to
the graph through a storage-less (n, 0) carrier tensor), so later values reuse one graph. A
counter's new value (``self.calls += 1``) is computed per call. Answers match eager on every
backend and target, with gradients."""
import pytest
import torch

import kiln
from tests.testing import TARGETS, on_target


def _stats():
    return kiln.stats()


def scale_and_slice(x, n):
    return x * n + 1, x[:n].sum(0), (x / n)[n - 1]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_an_int_argument_goes_dynamic_after_one_change(backend):
    f = kiln.compile(scale_and_slice, backend=backend)
    x = torch.randn(20, 3)
    for n in [2, 3, 7, 4, 19, 5, 2, 11]:
        for a, e in zip(f(x, n), scale_and_slice(x, n)):
            torch.testing.assert_close(a, e)
    s = _stats()
    assert s["recompiles"] == 1 and s["fallbacks"] == 0, s


@pytest.mark.parametrize("target", TARGETS)
def test_an_int_argument_on_each_target(target):
    with on_target(target) as device:
        f = kiln.compile(scale_and_slice)
        x = torch.randn(20, 3, device=device)
        for n in [2, 3, 9, 5, 17]:
            for a, e in zip(f(x, n), scale_and_slice(x, n)):
                torch.testing.assert_close(a, e)
    assert _stats()["recompiles"] == 1, _stats()


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls, self.calls * 2


def test_a_counter_attribute_compiles_twice_not_every_call():
    m, ref = Counter(), Counter()
    ref.load_state_dict(m.state_dict())
    f = kiln.compile(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(15):
            (a, k), (e, ke) = f(x), ref(x)
            torch.testing.assert_close(a, e)
            assert k == ke and type(k) is int
    assert m.calls == ref.calls == 15
    s = _stats()
    # 0 on the first compile, then (it changed) a symbol from 1 on: an int is not a size, so
    # 0 and 1 need no entry of their own (where one becomes a size it is specialized)
    assert s["recompiles"] == 1 and s["fallbacks"] == 0, s


def test_gradients_through_a_dynamic_int():
    torch.manual_seed(0)
    m, ref = Counter(), Counter()
    ref.load_state_dict(m.state_dict())
    f = kiln.compile(m)
    for step in range(6):
        x = torch.randn(3, 4)
        (a, _), (e, _) = f(x), ref(x)
        a.pow(2).sum().backward()
        e.pow(2).sum().backward()
        torch.testing.assert_close(m.lin.weight.grad, ref.lin.weight.grad)
        m.zero_grad(), ref.zero_grad()
    assert _stats()["fallbacks"] == 0


def rotary_offset(x, table, start):
    """A decoder step's position offset: rows start .. start + t of a table."""
    t = x.shape[0]
    return x + table[start:start + t] * start


@pytest.mark.parametrize("target", TARGETS)
def test_a_start_position_slices_a_table(target):
    with on_target(target) as device:
        f = kiln.compile(rotary_offset)
        table = torch.randn(64, 8, device=device)
        x = torch.randn(4, 8, device=device)
        for start in [0, 1, 2, 5, 9, 30, 60]:
            torch.testing.assert_close(f(x, table, start), rotary_offset(x, table, start))
    assert _stats()["recompiles"] <= 3, _stats()


def test_negative_ints_and_range_stay_correct():
    def f(x, n):
        out = x * n
        for i in range(abs(n) % 3):
            out = out + i
        return out
    g = kiln.compile(f)
    x = torch.randn(5)
    for n in [-1, -2, 3, 4, -5, 7, 8]:
        torch.testing.assert_close(g(x, n), f(x, n))
    assert _stats()["fallbacks"] == 0


def test_dynamic_false_keeps_ints_static():
    f = kiln.compile(scale_and_slice, dynamic=False)
    x = torch.randn(20, 3)
    for n in [2, 3, 4]:
        for a, e in zip(f(x, n), scale_and_slice(x, n)):
            torch.testing.assert_close(a, e)
    assert _stats()["recompiles"] == 2


def test_an_op_that_needs_a_python_int_keeps_the_int_static():
    """one_hot's num_classes must be a Python int: the symbolic trace fails, the int stays a
    constant for this code from then on, and each value compiles as before (no break)."""
    def f(x, n):
        return torch.nn.functional.one_hot(x.abs().long() % n, n).float() * n
    g = kiln.compile(f)
    x = torch.randn(6) * 5
    for n in [2, 3, 4, 6, 7, 3]:
        torch.testing.assert_close(g(x, n), f(x, n))
    s = _stats()
    assert s["graph_breaks"] == 0 and s["fallbacks"] == 0 and s["recompiles"] == 4, s


@pytest.mark.parametrize("target", TARGETS)
def test_a_symbolic_roll(target):
    def f(x, n):
        return x.roll(n, 0), x.roll(-n), x.roll((n, 1), (1, 0))
    with on_target(target) as device:
        g = kiln.compile(f)
        x = torch.randn(12, 6, device=device)
        for n in [2, 3, 4, 6, 13, 2]:
            for a, e in zip(g(x, n), f(x, n)):
                torch.testing.assert_close(a, e, rtol=0, atol=0)
    s = _stats()
    assert s["graph_breaks"] == 0 and s["recompiles"] == 1, s


def test_a_dynamic_int_live_across_a_graph_break(capsys):
    """The resume function gets the int itself (reloaded from the frame), not its traced value:
    the frame and its resume function each compile twice for any number of values."""
    def f(x, n):
        y = x * n
        print("between")
        return y + n, n + 1
    g = kiln.compile(f)
    x = torch.randn(5)
    for n in [2, 3, 4, 5, 9, 2, 3]:
        (a, k), (e, ke) = g(x, n), f(x, n)
        torch.testing.assert_close(a, e)
        assert k == ke
    assert capsys.readouterr().out.count("between") == 14
    s = _stats()
    assert s["recompiles"] == 2 and s["fallbacks"] == 0, s
