"""Edge cases that used to raise inside kiln and fall back to eager (issue 24, item 4), now
compiled: reductions of 0-d tensors and over empty dims, integer ``**`` integer, complex
dtypes (library calls), ``nan_to_num(nan=None)``, ``cat`` with empty pieces, ``where`` of two
scalars, ``squeeze`` of several dims. Each case runs compiled (strict: an internal error fails
the test instead of falling back) on fresh random inputs, on every target, and must match
eager in values, dtype, shape and strides, with no fallback; a result never aliases an input
where eager's does not. Where eager raises, the compiled call raises the same type."""
from __future__ import annotations

import pytest
import torch

import kiln
from testing import TARGETS, on_target


def _scalar(device):
    return torch.randn((), device=device) * 3


def _empty(device):
    return torch.randn(0, 5, device=device)


def _ints(device, dtype=torch.int64, n=40):
    lo = 0 if dtype == torch.uint8 else -9
    return torch.randint(lo, 10, (n,), device=device).to(dtype)


def _special(device, dtype):
    x = torch.randn(12, device=device).to(dtype)
    x[::4] = float("nan")
    x[1::4] = float("inf")
    x[2::4] = float("-inf")
    return x


CASES = {
    # reductions of a 0-d tensor: dim 0 and -1 name the tensor itself
    "sum_0d": (lambda x: x.sum(0), lambda d: (_scalar(d),)),
    "mean_0d": (lambda x: x.mean(-1), lambda d: (_scalar(d),)),
    "sum_0d_keepdim_int": (lambda x: x.sum(-1, keepdim=True), lambda d: (torch.randint(-5, 5, (), device=d),)),
    "max_0d": (lambda x: x.max(0), lambda d: (_scalar(d),)),
    "min_0d_keepdim": (lambda x: x.min(-1, keepdim=True), lambda d: (_scalar(d),)),
    "amax_0d": (lambda x: x.amax(0), lambda d: (_scalar(d),)),
    "argmax_0d": (lambda x: x.argmax(0), lambda d: (_scalar(d),)),
    "prod_0d": (lambda x: x.prod(0, keepdim=True), lambda d: (_scalar(d),)),
    "var_0d": (lambda x: x.var(0, correction=0), lambda d: (_scalar(d),)),
    "std_0d": (lambda x: x.std(-1, keepdim=True), lambda d: (_scalar(d),)),
    "logsumexp_0d": (lambda x: x.logsumexp(0), lambda d: (_scalar(d),)),
    "norm_0d": (lambda x: x.norm(dim=0), lambda d: (_scalar(d),)),
    # reductions over a dim of size 0: eager's identities, nan for a mean
    "sum_empty_dim": (lambda x: x.sum(0), lambda d: (_empty(d),)),
    "sum_empty_int": (lambda x: x.sum(0) + 1, lambda d: (torch.zeros(0, 3, dtype=torch.int32, device=d),)),
    "mean_empty_dim": (lambda x: x.mean(0, keepdim=True), lambda d: (_empty(d),)),
    "mean_empty_all": (lambda x: x.mean(), lambda d: (torch.randn(0, 0, device=d),)),
    "prod_empty_dim": (lambda x: x.prod(0), lambda d: (_empty(d),)),
    "amax_kept_empty_dim": (lambda x: x.amax(1), lambda d: (_empty(d),)),
    "var_empty": (lambda x: x.var(0), lambda d: (_empty(d),)),
    "logsumexp_empty": (lambda x: x.logsumexp(0), lambda d: (_empty(d),)),
    "sum_empty_half": (lambda x: x.sum(0), lambda d: (_empty(d).half(),)),
    # integer ** integer
    "int_pow_scalar": (lambda x: x ** 3, lambda d: (_ints(d),)),
    "int_pow_tensor": (lambda x, y: x ** y, lambda d: (_ints(d), torch.randint(-3, 40, (40,), device=d))),
    "int32_pow_tensor_wraps": (lambda x, y: x ** y, lambda d: (_ints(d, torch.int32), torch.randint(0, 30, (40,), device=d).int())),
    "int8_pow_tensor": (lambda x, y: x ** y, lambda d: (_ints(d, torch.int8), _ints(d, torch.int8))),
    "uint8_pow_tensor": (lambda x, y: x ** y, lambda d: (_ints(d, torch.uint8), _ints(d, torch.uint8))),
    "scalar_pow_int_tensor": (lambda y: 3 ** y, lambda d: (torch.randint(-2, 30, (40,), device=d),)),
    "minus_one_pow_int_tensor": (lambda y: (-1) ** y + 2 ** y.abs(), lambda d: (torch.randint(-9, 9, (40,), device=d),)),
    # complex: library calls
    "complex_abs": (lambda z: (z * 2 + 1).abs(), lambda d: (torch.randn(4, 3, dtype=torch.complex64, device=d),)),
    "complex_mixed": (lambda z, r: (z * r).abs() + r.sin(), lambda d: (torch.randn(4, 3, dtype=torch.complex64, device=d),
                                                                      torch.randn(4, 3, device=d))),
    "complex_views": (lambda z: z.t().reshape(-1) * 1j, lambda d: (torch.randn(4, 3, dtype=torch.complex64, device=d),)),
    "complex_made": (lambda r: torch.complex(r, r * 2).exp().abs() + 1, lambda d: (torch.randn(6, device=d),)),
    "complex128": (lambda z: z.exp() + z.conj(), lambda d: (torch.randn(5, dtype=torch.complex128, device=d),)),
    # nan_to_num with None replacements (the type's defaults)
    "nan_to_num_none_fp32": (lambda x: torch.nan_to_num(x, nan=None), lambda d: (_special(d, torch.float32),)),
    "nan_to_num_none_fp16": (lambda x: torch.nan_to_num(x, nan=None, posinf=None, neginf=-7.0), lambda d: (_special(d, torch.float16),)),
    "nan_to_num_bf16": (lambda x: torch.nan_to_num(x, None, 3.0, None), lambda d: (_special(d, torch.bfloat16),)),
    "nan_to_num_int": (lambda x: torch.nan_to_num(x, nan=None), lambda d: (_ints(d),)),
    # cat with empty pieces
    "cat_one_empty": (lambda x: torch.cat([x]), lambda d: (torch.randn(0, device=d),)),
    "cat_one_piece": (lambda x: torch.cat([x], 1), lambda d: (torch.randn(3, 4, device=d),)),
    "cat_empty_pieces": (lambda x, y: torch.cat([x, y, x]), lambda d: (torch.randn(0, 3, device=d), torch.randn(2, 3, device=d))),
    "cat_legacy_1d_empty": (lambda x, y: torch.cat([x, y, x], 1), lambda d: (torch.randn(0, device=d), torch.randn(2, 3, device=d))),
    "cat_only_legacy_empty": (lambda x, y: torch.cat([x, y]), lambda d: (torch.randn(0, device=d), torch.randn(0, device=d))),
    # where of two scalars: eager's dtypes
    "where_float_scalars": (lambda c: torch.where(c, 1.0, 0.0), lambda d: (torch.rand(7, device=d) > 0.5,)),
    "where_int_scalars": (lambda c: torch.where(c, 1, 0), lambda d: (torch.rand(7, device=d) > 0.5,)),
    "where_mixed_scalars": (lambda c: torch.where(c, 2, 0.5) * 3, lambda d: (torch.rand(2, 7, device=d) > 0.5,)),
    "where_bool_scalars": (lambda c: torch.where(c, False, True), lambda d: (torch.rand(7, device=d) > 0.5,)),
    # squeeze of several dims: dims that are not size 1 stay
    "squeeze_tuple": (lambda x: x.squeeze((0, 2)) * 2, lambda d: (torch.randn(1, 3, 1, 2, device=d),)),
    "squeeze_keeps_non_unit": (lambda x: x.squeeze((1, 2, -1)) + 1, lambda d: (torch.randn(1, 3, 1, 2, device=d),)),
    "squeeze_varargs": (lambda x: x.squeeze(0, 2).clone(), lambda d: (torch.randn(1, 3, 1, 2, device=d),)),
    "squeeze_0d": (lambda x: x.sum().squeeze((0,)) * 2, lambda d: (torch.randn(3, device=d),)),
}


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_edge_case_compiles_and_matches_eager(name, target):
    fn, make = CASES[name]
    with on_target(target) as device, kiln.config.patch(strict=True):
        args = make(device)
        want = _outputs(fn(*args))
        got = _outputs(kiln.compile(fn)(*args))
        assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride()), name
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-5, atol=1e-5)
        for a in args:  # eager's result is fresh memory: so is kiln's
            assert not (g.numel() and a.numel() and g.data_ptr() == a.data_ptr()), f"{name}: result aliases an input"


RAISES = {
    "amax_over_empty_dim": (lambda x: x.amax(0), lambda d: (_empty(d),)),
    "max_dim_over_empty_dim": (lambda x: x.max(0), lambda d: (_empty(d),)),
    "argmax_over_empty_dim": (lambda x: x.argmax(0), lambda d: (_empty(d),)),
    "argmax_of_empty": (lambda x: x.argmax(), lambda d: (_empty(d),)),
    "amin_of_empty": (lambda x: x.amin(), lambda d: (_empty(d),)),
    "int_pow_negative_scalar": (lambda x: x ** -2, lambda d: (_ints(d),)),
    "int_pow_negative_scalar_fn": (lambda x: torch.pow(x, -1), lambda d: (_ints(d, torch.int32),)),
    "squeeze_repeated_dim": (lambda x: x.squeeze((0, 0)), lambda d: (torch.randn(1, 3, device=d),)),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(RAISES))
def test_edge_case_raises_what_eager_raises(name, target):
    fn, make = RAISES[name]
    with on_target(target) as device:
        args = make(device)
        with pytest.raises(Exception) as eager:
            fn(*args)
        with kiln.config.patch(strict=True), pytest.raises(type(eager.value)):
            kiln.compile(fn)(*args)
        assert kiln.stats()["fallbacks"] == 0
