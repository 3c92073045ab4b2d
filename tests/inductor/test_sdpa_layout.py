"""Attention's result is laid out like q when torch runs a fused kernel (prims.sdpa's meta):
those kernels return it that way, so after ``q = x.view(B, T, H, D).transpose(1, 2)`` the
usual ``y.transpose(1, 2).reshape(B, T, C)`` is a view and no kernel copies it. Its math kernel
returns a contiguous result, which the meta then promises. Wherever the real result differs
from the promise, ensure_layout copies it, so values always match eager."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target

B, T, H, D = 2, 64, 4, 16
C = H * D


def _attention(qkv_w, proj_w, mask=None, contiguous_q=False):
    def f(x):
        q, k, v = (x @ qkv_w).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        if contiguous_q:
            q = q.contiguous()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return y.transpose(1, 2).reshape(B, T, C) @ proj_w
    return f


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["causal", "mask", "contiguous_q"])
def test_attention_output_layout_matches_eager(variant, dtype, target):
    torch.manual_seed(0)
    with on_target(target) as device, torch.no_grad():
        x = torch.randn(B, T, C, device=device, dtype=dtype)
        qkv_w = torch.randn(C, 3 * C, device=device, dtype=dtype) / C ** 0.5
        proj_w = torch.randn(C, C, device=device, dtype=dtype) / C ** 0.5
        mask = torch.randn(T, T, device=device, dtype=dtype) if variant == "mask" else None
        f = _attention(qkv_w, proj_w, mask, contiguous_q=variant == "contiguous_q")
        out = kiln.explain(f)(x)
        assert_close(out.result, f(x), dtype)
        if variant == "causal":  # nothing between attention and the projection's GEMM
            pointwise = [k for k in out.kernels if "sdpa" not in k.name]
            assert not pointwise, [k.source for k in pointwise]
