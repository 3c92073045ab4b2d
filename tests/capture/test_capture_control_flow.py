"""Python-level control flow and arithmetic are evaluated while tracing (specialized)."""
import math

import torch

from capture_helpers import check
from kiln.ops import core

SCALE = 3


def x48():
    return (torch.randn(4, 8),)


def test_constant_folded_python_arithmetic():
    def fn(x):
        a = 2 ** 3 + 7 // 2 - 5 % 3
        b = (a * 1.5) / 4 + math.sqrt(16) + abs(-2) + max(1, 2, a) + min(a, 0)
        c = SCALE << 1 | 1
        return x * (a + b + c) + (-a)

    result = check(fn, x48)
    assert [n.target for n in result.graph.calls] == [core.mul, core.add]
    assert any("G['SCALE']" in g for g in result.guards)


def test_for_loop_over_range_is_unrolled():
    def fn(x):
        for i in range(3):
            x = x * 2 + i
        total = 0
        for j in range(1, 10, 4):
            total += j
        return x + total

    result = check(fn, x48)
    assert len(result.graph.calls) == 7


def test_loops_over_tuples_lists_dicts():
    def fn(x, y):
        out = []
        for t in (x, y):
            out.append(t.relu())
        for k, v in {"a": 1, "b": 2}.items():
            out.append(x * v)
        for i, t in enumerate([x, y]):
            out.append(t + i)
        for a, b in zip([x, y], [y, x]):
            out.append(a - b)
        s = x
        for t in out:
            s = s + t
        return s

    check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_branches_on_constants():
    def fn(x, flag, n):
        if flag:
            x = x + 1
        else:
            x = x - 1
        if n > 2 and n != 5 or n is None:
            x = x * n
        while n > 0:
            x = x + n
            n -= 1
        return x if not flag else -x

    check(fn, lambda: (torch.randn(4, 8), True, 3))
    check(fn, lambda: (torch.randn(4, 8), False, 1))


def test_closure_and_nested_function():
    def fn(x):
        k = 2.0

        def inner(t, bias=1.0):
            return t * k + bias

        return inner(x) + inner(x, bias=0.5)

    check(fn, x48)


def test_closure_from_enclosing_scope():
    factor = 4.0

    def helper(t):
        return t * factor

    def fn(x):
        return helper(x).sigmoid()

    result = check(fn, x48)
    assert any("L['helper']" in g for g in result.guards)


def test_comprehensions_and_star_calls():
    def add3(a, b, c):
        return a + b + c

    def fn(x, y):
        ts = [t * 2 for t in (x, y)]
        args = (x, y, ts[0])
        kw = {"c": ts[1]}
        return add3(*args), add3(x, *ts), add3(x, y, **kw), tuple(t.relu() for t in [x])[0] if False else x

    check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_slicing_and_unpacking():
    def fn(xs):
        a, b, *rest = xs if False else (xs[0], xs[1], xs[2])
        first, second = xs[:2]
        return a + b + first * second + xs[-1] + len(xs[1:3])

    check(fn, lambda: ((torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)),))


def test_varargs_and_kwargs_sources():
    def fn(*args, **kwargs):
        return args[0] + args[1] * kwargs["scale"]

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    from kiln.capture import trace
    from capture_helpers import run_captured
    result = trace(fn, (x, y), {"scale": 2.0})
    assert result.input_sources == ["L['args'][0]", "L['args'][1]"]
    torch.testing.assert_close(run_captured(result, fn, (x, y), {"scale": 2.0}), fn(x, y, scale=2.0))
