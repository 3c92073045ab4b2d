"""A negative-zero constant keeps its sign through capture, guards, cse and codegen.

``0.0 == -0.0`` in Python (and in sympy), so every place that compares, hashes or folds
constants can lose the sign: ``x / -0.0`` must be -inf for a positive x on every backend.
Results are compared with eager bit for bit, the sign of zeros included.
"""
from __future__ import annotations

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", "kiln"]


def _same(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(torch.signbit(g), torch.signbit(e)), (g, e)


CASES = {
    "div": lambda x: x / -0.0,
    "div_both_signs": lambda x: (x / 0.0, x / -0.0),          # cse must keep two nodes
    "mul": lambda x: x * -0.0,
    "mul_both_signs": lambda x: (1.0 / (x * 0.0), 1.0 / (x * -0.0)),
    "rdiv": lambda x: -0.0 / x,
    "add": lambda x: 1.0 / ((x * 0.0) + -0.0),                # +0 + -0 is +0
    "sub": lambda x: 1.0 / (-0.0 - (x * 0.0)),                # -0 - +0 is -0
    "where": lambda x: 1.0 / torch.where(x > 0, -0.0, 0.0),
    "masked_fill": lambda x: 1.0 / x.masked_fill(x > 0, -0.0),
    "full_like": lambda x: 1.0 / torch.full_like(x, -0.0),
    "copysign": lambda x: torch.copysign(x, -0.0),
    "atan2": lambda x: torch.atan2(x * 0.0, torch.full_like(x, -0.0)),
    "clamp_max": lambda x: 1.0 / torch.clamp(x * 0.0 - 1.0, max=-0.0),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_negative_zero_constant(name, dtype, backend):
    fn = CASES[name]
    x = torch.rand(8, dtype=dtype) + 0.5  # positive
    _same(kiln.compile(fn, backend=backend)(x), fn(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_argument_is_guarded_by_its_sign(backend):
    f = kiln.compile(lambda x, c: x / c, backend=backend)
    x = torch.rand(4) + 0.5
    _same(f(x, 0.0), x / 0.0)
    _same(f(x, -0.0), x / -0.0)
    _same(f(x, 0.0), x / 0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_in_a_tuple_argument_is_guarded_by_its_sign(backend):
    f = kiln.compile(lambda x, cs: x / cs[0], backend=backend)
    x = torch.rand(4) + 0.5
    _same(f(x, (0.0, 1.0)), x / 0.0)
    _same(f(x, (-0.0, 1.0)), x / -0.0)
