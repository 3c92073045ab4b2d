"""Ops that allocate in their input's suggested memory format keep eager's output strides
(meta/strides.py ``format_like_input``): constant pad, max and average pooling, adaptive
pooling and interpolation over a channels-last input return channels-last, as eager does, and a
pointwise result over contiguous operands is contiguous even where a size-1 dim's stride could
say otherwise (TensorIterator's fast setup). Each case is checked against eager: values, dtype,
strides, no fallback."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.meta.strides import strides_like_channels_last
from testing import assert_close


def _cl(t):
    return t.to(memory_format=torch.channels_last)


INPUTS = {
    "channels_last": lambda: _cl(torch.randn(2, 16, 8, 8)),
    "contiguous": lambda: torch.randn(2, 16, 8, 8),
    "cl_batch1": lambda: _cl(torch.randn(1, 16, 8, 8)),
    "cl_one_channel": lambda: _cl(torch.randn(2, 1, 8, 8)),
    "cl_channel_slice": lambda: _cl(torch.randn(2, 32, 8, 8))[:, ::2],
    "permuted": lambda: torch.randn(2, 8, 16, 8).permute(0, 2, 1, 3),
}

OPS = {
    "max_pool": lambda x: F.max_pool2d(x, 3, 2, 1),
    "avg_pool": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "pad": lambda x: F.pad(x, (1, 1, 1, 1)),
    "pad_mixed": lambda x: F.pad(x, (1, -1, 0, 1), value=2.0),
    "adaptive": lambda x: F.adaptive_avg_pool2d(x, 2),
    "adaptive_1x1": lambda x: F.adaptive_avg_pool2d(x, 1),
    "nearest": lambda x: F.interpolate(x, scale_factor=2),
    "bilinear": lambda x: F.interpolate(x, size=(5, 7), mode="bilinear"),
    "relu_then_pool": lambda x: F.max_pool2d(x.relu(), 2),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("inp", list(INPUTS))
def test_output_strides_follow_the_input_format_as_eager(inp, op):
    f = OPS[op]
    kiln.reset()
    compiled = kiln.compile(f)
    for _ in range(2):  # fresh inputs each call
        x = INPUTS[inp]()
        with torch.no_grad():
            want, got = f(x), compiled(x)
        assert_close(got, want)
        assert got.dtype == want.dtype and got.stride() == want.stride(), (got.stride(), want.stride())
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_runs"] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_pooling_and_grads_keep_channels_last(dtype):
    def f(x):
        return F.max_pool2d(F.pad(x, (1, 1, 1, 1)) * 2, 3, 2) + F.interpolate(F.avg_pool2d(x, 4), scale_factor=2)

    kiln.reset()
    compiled = kiln.compile(f)
    x = _cl(torch.randn(2, 8, 8, 8)).to(dtype).requires_grad_()
    xe = x.detach().clone().requires_grad_()
    got, want = compiled(x), f(xe)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert got.dtype == want.dtype and got.stride() == want.stride()
    got.float().sum().backward()
    want.float().sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, rtol=2e-2, atol=2e-2)
    assert x.grad.stride() == xe.grad.stride()
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("make", [
    lambda: torch.randn(2, 16, 8, 8), lambda: _cl(torch.randn(2, 16, 8, 8)),
    lambda: _cl(torch.randn(2, 1, 8, 8)), lambda: torch.randn(2, 1, 8, 8),
    lambda: torch.randn(1, 16, 1, 1), lambda: _cl(torch.randn(1, 16, 1, 1)),
    lambda: _cl(torch.randn(2, 32, 8, 8))[:, ::2], lambda: torch.randn(2, 8, 16, 8).permute(0, 2, 1, 3),
    lambda: torch.randn(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d),
    lambda: torch.randn(2, 3, 4, 5, 6), lambda: torch.randn(2, 3, 4, 5)[:, :, :, :0],
])
def test_strides_like_channels_last_reads_as_torch_does(make):
    t = make()
    if t.numel() == 0:
        assert not strides_like_channels_last(tuple(t.shape), t.stride())
        return
    fmt = torch.channels_last if t.ndim == 4 else torch.channels_last_3d
    # torch's suggest_memory_format, as constant_pad_nd (which allocates in it) reports it
    out = F.pad(t, (1, 1))
    cl = torch.empty(out.shape, memory_format=fmt).stride()
    want = out.stride() == cl and cl != torch.empty(out.shape).stride()
    assert strides_like_channels_last(tuple(t.shape), t.stride()) == want
