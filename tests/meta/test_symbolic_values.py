"""A symbolic size used as a value stays symbolic: ``y * n``, ``y / n``, ``(z * n) // 2`` and
``torch.arange`` over symbolic bounds compile once for every size (kernels read the size as an
argument), on every target, in fp32, bf16 and integer dtypes, and match eager."""
import pytest
import torch

import kiln
from tests.testing import TARGETS, TOLERANCES, on_target

SIZES = (3, 5, 8, 13, 6)


def _check(fn, make, target, max_recompiles=0, tol=None):
    with on_target(target) as device:
        g = kiln.compile(fn, dynamic=True)
        for n in SIZES:
            args = make(n, device)
            got, want = g(*args), fn(*args)
            for a, e in zip(got, want):
                assert a.shape == e.shape and a.dtype == e.dtype, (n, a.shape, e.shape, a.dtype, e.dtype)
                rtol, atol = (tol or TOLERANCES).get(e.dtype, (0, 0))
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
    assert kiln.stats()["recompiles"] <= max_recompiles, kiln.stats()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_size_as_a_scalar_operand_stays_symbolic(target, dtype):
    def f(x, y, z):
        n = x.shape[0]
        return y * n + y[:n].sum() - n, (z * n) // 2, y / n, (y.t() * n)[1:]

    def make(n, device):
        y = torch.randn(16, 4, device=device, dtype=dtype)
        return (torch.randn(n, 2, device=device), y, torch.randint(0, 9, (5,), device=device))
    # bf16: eager rounds y * n (up to ~40, an ulp of 0.25) before the sum; the fused kernel does not
    _check(f, make, target, tol={**TOLERANCES, torch.bfloat16: (2e-2, 0.25)})


@pytest.mark.parametrize("target", TARGETS)
def test_arange_over_symbolic_bounds(target):
    def f(x):
        n = x.shape[0]
        return (torch.arange(n) * 2, torch.arange(n - 1, -1, -1), torch.arange(2, 2 * n + 1, 3) + 1,
                torch.arange(n, dtype=torch.float32, device=x.device) + x[:, 0])

    _check(f, lambda n, device: (torch.randn(n, 2, device=device),), target)


@pytest.mark.parametrize("target", TARGETS)
def test_an_arange_of_length_one_specializes_and_recompiles_correctly(target):
    """ceil((n - 1) / 2) is 1 at n = 3: a size of 1 is specialized (broadcasting depends on
    it), so the next size recompiles once and every answer still matches."""
    _check(lambda x: (torch.arange(1, x.shape[0], 2) * x.shape[0],),
           lambda n, device: (torch.randn(n, 2, device=device),), target, max_recompiles=1)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_size_used_only_as_a_value_reaches_the_backward(backend):
    """The backward of ``lin(x) * y.shape[0]`` uses the symbol only as a scalar (its saved
    tensors are static): it must take the call's value, not the traced one."""
    torch.manual_seed(0)
    lin, ref = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ref.load_state_dict(lin.state_dict())

    def f(m, x, y):
        return m(x) * y.shape[0]
    g = kiln.compile(f, dynamic=True, backend=backend)
    x = torch.randn(2, 4)  # no size of y equals 2: no duck-sized symbol to split later
    for n in SIZES:
        y = torch.randn(n)
        a, e = g(lin, x, y), f(ref, x, y)
        a.pow(2).sum().backward()
        e.pow(2).sum().backward()
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
        torch.testing.assert_close(lin.bias.grad, ref.bias.grad)
        lin.zero_grad()
        ref.zero_grad()
    assert kiln.stats()["recompiles"] == 0, kiln.stats()


def test_a_returned_size_is_computed_per_call():
    """``return x.shape[0] + 1`` under dynamic shapes: read from the call's input, not
    specialized (a constant tuple that merely looks like a spec stays a constant)."""
    def f(x):
        return x * 2, x.shape[0] + 1, ("symint", "x", {"a": 1})
    g = kiln.compile(f, dynamic=True)
    for n in SIZES:
        x = torch.randn(n)
        (a, k, c), (ea, ek, ec) = g(x), f(x)
        torch.testing.assert_close(a, ea)
        assert k == ek and type(k) is int and c == ec
    assert kiln.stats()["recompiles"] == 0, kiln.stats()
