"""A linear's bias rides in the GEMM (``prims.addmm``, as torch's F.linear does): no kernel
re-reads the product to add it, and views of the result (a qkv split into heads) stay views."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, TOLERANCES, on_target, randn


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_linear_with_bias_is_one_library_call_and_matches_eager(target, dtype, layout):
    with on_target(target) as device:
        x = randn((6, 12), dtype, device, layout)  # transposed: a non-contiguous input
        w, b = randn((5, 12), dtype, device), randn((5,), dtype, device)
        ex = kiln.explain(lambda x, w, b: F.linear(x, w, b))(x, w, b)
        assert (ex.kernel_count, ex.extern_calls) == (0, 1), (ex.kernel_count, ex.extern_calls)
        rtol, atol = TOLERANCES[dtype]
        # F.linear itself: a builtin, compiled through a Python frame that calls it
        torch.testing.assert_close(kiln.compile(F.linear)(x, w, b), F.linear(x, w, b), rtol=rtol, atol=atol)


@pytest.mark.parametrize("target", TARGETS)
def test_heads_split_from_a_projection_reach_attention_as_views(target):
    def f(x, w, b):
        q, k, v = (z.view(2, 3, 2, 4).transpose(1, 2) for z in F.linear(x, w, b).split(8, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with on_target(target) as device:
        x, w, b = torch.randn(2, 3, 8, device=device), torch.randn(24, 8, device=device), torch.randn(24, device=device)
        ex = kiln.explain(f)(x, w, b)
        assert ex.kernel_count == 0, ex.kernel_count  # addmm, then attention reads views of it
        torch.testing.assert_close(kiln.compile(f)(x, w, b), f(x, w, b), rtol=1e-5, atol=1e-5)


def test_a_bias_of_another_dtype_keeps_the_separate_add():
    x, w, b = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, dtype=torch.float64)
    g = kiln.compile(lambda x, w, b: x @ w.t() + b)
    torch.testing.assert_close(g(x, w, b), x @ w.t() + b)
