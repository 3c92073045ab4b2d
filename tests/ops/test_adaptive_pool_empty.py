"""Adaptive average pooling to an output size of 0 (peer
``test_adaptive_avg_pool_with_output_size_0``): eager gives an empty result; the meta refused
it ("empty input or output size"), running the frame eagerly."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln


@pytest.mark.parametrize("make", [
    lambda: (nn.AdaptiveAvgPool1d(0), torch.randn(1, 2)),
    lambda: (nn.AdaptiveAvgPool2d(0), torch.randn(1, 2, 3)),
    lambda: (nn.AdaptiveAvgPool2d((2, 0)), torch.randn(2, 3, 4, 5, requires_grad=True)),
    lambda: (nn.AdaptiveAvgPool2d((0, 3)), torch.randn(2, 3, 4, 5)),
], ids=["1d", "2d", "2d_width_0_grad", "2d_height_0"])
def test_output_size_zero_is_empty_like_eager(make):
    m, x = make()
    got, want = kiln.compile(m, fullgraph=True)(x), m(x)
    assert got.shape == want.shape and got.dtype == want.dtype and got.numel() == 0
    assert got.requires_grad == want.requires_grad
    assert kiln.stats()["eager_runs"] == 0


def test_nonempty_adaptive_pool_unchanged():
    m, x = nn.AdaptiveAvgPool2d((3, 2)), torch.randn(2, 3, 7, 5)
    assert torch.allclose(kiln.compile(m, fullgraph=True)(x), m(x), atol=1e-6)
