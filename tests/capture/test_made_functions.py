"""Lambdas and nested functions (a new object per call of their maker) passed to compiled code
are guarded by their code, defaults and closure cells, not by identity: a fresh closure over
fresh tensors reuses the compiled entry, while a changed captured constant or default
recompiles. Every made function is kept alive so no two share an address."""
import pytest
import torch

import kiln
from kiln.capture import trace
from capture_helpers import locals_for
from tests.capture.resume_helpers import BACKENDS

KEEP = []  # made functions outlive the test's calls: a reused address can't hide a recompile


def apply(f, x):
    return f(x) + 1


def scaled_by(w):
    return lambda t: t * w


def power_of(n):
    def power(t):
        return t ** n
    return power


def with_default(k):
    return lambda t, k=k: t * k


def made(fn, *args):
    f = fn(*args)
    KEEP.append(f)
    return f


@pytest.mark.parametrize("backend", BACKENDS)
def test_closure_over_fresh_tensors_does_not_recompile(backend):
    compiled = kiln.compile(apply, backend=backend)
    for _ in range(4):
        w, x = torch.randn(3, 4), torch.randn(3, 4)
        f = made(scaled_by, w)
        torch.testing.assert_close(compiled(f, x), apply(f, x))
    stats = kiln.stats()
    assert stats["frames_compiled"] == 1 and stats["recompiles"] == 0, stats
    assert stats["cache_hits"] == 3, stats


@pytest.mark.parametrize("backend", BACKENDS)
def test_closure_over_a_changed_int_recompiles(backend):
    compiled = kiln.compile(apply, backend=backend)
    x = torch.randn(3, 4)
    for n in (2, 2, 3, 3):
        f = made(power_of, n)
        torch.testing.assert_close(compiled(f, x), apply(f, x))
    stats = kiln.stats()
    assert stats["recompiles"] == 1 and stats["cache_hits"] == 2, stats


@pytest.mark.parametrize("backend", BACKENDS)
def test_lambda_with_a_changed_default_recompiles(backend):
    compiled = kiln.compile(apply, backend=backend)
    x = torch.randn(3, 4)
    for k in (2.0, 2.0, 5.0, 5.0):
        f = made(with_default, k)
        torch.testing.assert_close(compiled(f, x), apply(f, x))
    stats = kiln.stats()
    assert stats["recompiles"] == 1 and stats["cache_hits"] == 2, stats


def test_guards_read_code_defaults_and_cells():
    x = torch.randn(3, 4)
    f = made(with_default, 2.0)
    result = trace(apply, (f, x), {})
    text = " ".join(result.guards)
    assert "L['f'].__code__" in text and "L['f'].__defaults__[0] == 2.0" in text
    assert "id(L['f']) ==" not in text  # not the function object itself

    def passes(g, y=x):
        return result.guard_fn(locals_for(apply, (g, y), {}), apply.__globals__)
    assert passes(made(with_default, 2.0))
    assert not passes(made(with_default, 3.0))           # the default's value
    assert not passes(made(scaled_by, x))                # other code
    assert not passes(lambda t, k=2.0, j=1: t * k)       # other code, too

    g = made(power_of, 2)
    result = trace(apply, (g, x), {})
    assert "L['f'].__closure__[0].cell_contents == 2" in " ".join(result.guards)
    assert passes(made(power_of, 2))
    assert not passes(made(power_of, 2.0))               # int -> float in the cell
    h = made(power_of, 2)
    h.marked = True
    assert not passes(h)                                 # function attributes: by identity


def test_is_between_made_functions_is_guarded():
    def same(f, g, x):
        return x * 2 if f is g else x * 3

    x = torch.randn(3, 4)
    compiled = kiln.compile(same, backend="eager")
    f, g = made(scaled_by, x), made(scaled_by, x)
    for a, b in ((f, f), (f, g), (g, g), (g, f)):
        torch.testing.assert_close(compiled(a, b, x), same(a, b, x))
    stats = kiln.stats()
    assert stats["recompiles"] == 1 and stats["cache_hits"] == 2, stats
