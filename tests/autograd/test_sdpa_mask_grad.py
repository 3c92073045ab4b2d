"""Gradients of scaled_dot_product_attention with an attention mask match eager autograd.

Covers boolean and float (additive) masks, masks broadcast over batch and heads (whose
gradient is summed back to the mask's shape), a float mask that requires grad, rows that the
mask hides entirely, and the paths kiln takes: torch's fused kernel with its saved
log-sum-exp (CPU flash), the recomputing backward (what CUDA takes for every masked call:
``cuda_like`` makes the CPU choose it too), and the decomposed backward
(``fused_attention_backward`` off).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ops import attention

B, H, T, S, D = 2, 3, 16, 24, 8
# two roundings of the half type (eager's kernels and kiln's each round once, at their own spots)
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _mask(kind, dtype):
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(B, H, T, S, generator=g) > 0.3
    keep[..., 0] = True  # every row attends somewhere (eager's math kernel gives NaN otherwise)
    if kind == "bool":
        return keep
    if kind == "bool_broadcast":
        return keep[0, 0]                        # [T, S] over batch and heads
    if kind == "bool_heads":
        return keep[:, :1]                       # [B, 1, T, S]
    if kind == "float":
        return torch.randn(B, H, T, S, generator=g).to(dtype)
    if kind == "float_broadcast":
        return torch.randn(1, 1, T, S, generator=g).to(dtype)
    if kind == "float_batch":
        return torch.randn(B, 1, 1, S, generator=g).to(dtype)
    raise ValueError(kind)


MASKS = ["bool", "bool_broadcast", "bool_heads", "float", "float_broadcast", "float_batch"]
PATHS = ["default", "cuda_like", "decomposed"]


@pytest.fixture
def path(request, monkeypatch):
    name = request.param
    if name == "cuda_like":
        real = attention.choose_backend

        def no_fused_with_mask(q, k, v, attn_mask, is_causal, scale):
            return None if attn_mask is not None else real(q, k, v, attn_mask, is_causal, scale)
        monkeypatch.setattr(attention, "choose_backend", no_fused_with_mask)
    if name == "decomposed":
        monkeypatch.setattr(kiln.config, "fused_attention_backward", False)
    return name


def _grads(fn, q, k, v, mask, mask_grad):
    ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    m = mask.detach().clone().requires_grad_() if mask_grad else mask
    out = fn(*ins, m)
    g = torch.ones_like(out) * 0.5 + torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) * 1e-3
    out.backward(g)
    return [out] + [t.grad for t in ins] + ([m.grad] if mask_grad else [])


def attend(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", MASKS)
def test_sdpa_grads_with_a_mask_match_eager(kind, dtype, path):
    q, k, v = (torch.randn(B, H, n, D).to(dtype) for n in (T, S, S))
    mask = _mask(kind, dtype)
    expected = _grads(attend, q, k, v, mask, False)
    got = _grads(kiln.compile(attend), q, k, v, mask, False)
    rtol, atol = TOL[dtype]
    for name, a, b in zip(("out", "q", "k", "v"), got, expected):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name} ({kind}, {path}): {m}")
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["float", "float_broadcast", "float_batch"])
def test_grad_of_a_float_mask_matches_eager(kind, dtype, path):
    q, k, v = (torch.randn(B, H, n, D).to(dtype) for n in (T, S, S))
    mask = _mask(kind, dtype)
    expected = _grads(attend, q, k, v, mask, True)
    got = _grads(kiln.compile(attend), q, k, v, mask, True)
    rtol, atol = TOL[dtype]
    for name, a, b in zip(("out", "q", "k", "v", "mask"), got, expected):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name} ({kind}, {path}): {m}")
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["bool", "float", "float_batch"])
def test_low_precision_grads_are_as_close_to_fp32_as_eagers(kind, dtype, path):
    """Eager's kernels accumulate fp16/bf16 attention in fp32; kiln's backward must be no
    further from the fp32 gradients than eager is (the per-op rounding of a half-precision
    recomputation was 2-3x further)."""
    q, k, v = (torch.randn(B, H, n, D).to(dtype) for n in (T, S, S))
    mask = _mask(kind, dtype)
    mask_grad = mask.dtype != torch.bool
    expected = _grads(attend, q, k, v, mask, mask_grad)
    got = _grads(kiln.compile(attend), q, k, v, mask, mask_grad)
    up = [t.float() for t in (q, k, v)] + [mask.float() if mask_grad else mask]
    ref = _grads(attend, *up, mask_grad)
    for name, a, b, r in zip(("out", "q", "k", "v", "mask"), got, expected, ref):
        err, eager_err = (a.float() - r).abs().max().item(), (b.float() - r).abs().max().item()
        assert err <= 1.25 * eager_err + 1e-6, \
            f"{name} ({kind}, {path}): {err:.3g} from the fp32 gradient, eager {eager_err:.3g}"
