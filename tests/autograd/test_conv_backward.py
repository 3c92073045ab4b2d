"""Convolution's backward as one library call (kiln/ops/conv.py): gradients against eager
autograd for 1d/2d/3d, strides, padding, dilation and groups, only the gradients something
needs, channels-last and non-contiguous inputs, reduced precision, and the decomposed form
(config.conv_library_backward=False) kept for an A/B."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ops import conv as conv_ops
from testing import CUDA, assert_close

DEVICES = ["cpu"] + (["cuda"] if CUDA else [])

CASES = [  # (input shape, weight shape, stride, padding, dilation, groups)
    ((2, 3, 9), (4, 3, 3), (1,), (1,), (1,), 1),
    ((2, 3, 11), (4, 3, 3), (2,), (2,), (2,), 1),
    ((2, 3, 8, 7), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 9, 10), (6, 2, 3, 2), (2, 3), (1, 0), (1, 2), 2),
    ((2, 3, 9, 9), (4, 3, 1, 1), (2, 2), (0, 0), (1, 1), 1),   # a ResNet downsample
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), (1, 2, 1), (1, 1, 0), (1, 1, 1), 1),
]


def _conv(x, w, b, stride, padding, dilation, groups):
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    return fn(x, w, b, stride, padding, dilation, groups)


def _grads(fn, x, w, b, tangent):
    out = fn(x, w, b)
    leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
    return out, torch.autograd.grad(out, leaves, tangent)


def _check(case, dtype=torch.float32, x_grad=True, bias=True, layout=None, library=True, device="cpu"):
    xs, ws, stride, padding, dilation, groups = case
    torch.manual_seed(hash((xs, ws)) % 1000)
    x = torch.randn(xs, dtype=dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "transposed":  # a non-contiguous input: the last two dims swapped in memory
        x = torch.randn(xs[:-2] + (xs[-1], xs[-2]), dtype=dtype).transpose(-1, -2)
    x = x.to(device).requires_grad_(x_grad)
    w = torch.randn(ws, dtype=dtype).to(device).requires_grad_(True)
    b = torch.randn(ws[0], dtype=dtype).to(device).requires_grad_(True) if bias else None

    def fn(x, w, b):
        return _conv(x, w, b, stride, padding, dilation, groups) * 2.0

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # fp32 convolutions on CUDA held to fp32 tolerances
    try:
        with kiln.config.patch(conv_library_backward=library, strict=True):
            compiled = kiln.compile(fn)
            want_out = fn(x, w, b)
            tangent = torch.randn_like(want_out)
            got_out, got = _grads(compiled, x, w, b, tangent)
        _, want = _grads(fn, x, w, b, tangent)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    assert_close(got_out, want_out, dtype)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert_close(g, e, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("library", [True, False], ids=["library", "decomposed"])
@pytest.mark.parametrize("case", CASES, ids=[f"{len(c[0]) - 2}d_{i}" for i, c in enumerate(CASES)])
def test_conv_grads_match_eager(case, library, device):
    _check(case, library=library, device=device)


@pytest.mark.parametrize("x_grad,bias", [(False, True), (True, False), (False, False)])
def test_only_the_needed_gradients(x_grad, bias):
    _check(CASES[2], x_grad=x_grad, bias=bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_conv_grads_of_strided_inputs(layout, device):
    _check(CASES[3], layout=layout, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_conv_grads_reduced_precision(dtype, device):
    _check(CASES[2], dtype=dtype, device=device)


@pytest.mark.parametrize("library", [True, False], ids=["library", "decomposed"])
def test_backward_runs_one_library_call_per_conv(library):
    """The compiled backward calls aten.convolution_backward once per convolution (the
    decomposed form calls none: convolutions only), and the gradients match eager."""
    x = torch.randn(2, 3, 8, 8)
    w1 = torch.randn(4, 3, 3, 3, requires_grad=True)
    w2 = torch.randn(4, 4, 3, 3, requires_grad=True)

    def fn(x):
        return F.conv2d(torch.relu(F.conv2d(x, w1, padding=1)), w2, stride=2, padding=1).sum()

    with kiln.config.patch(strict=True, conv_library_backward=library):
        out = kiln.compile(fn)(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = torch.autograd.grad(out, (w1, w2))
    calls = [e.name for e in prof.events() if e.name == "aten::convolution_backward"]
    assert len(calls) == (2 if library else 0)
    want = torch.autograd.grad(fn(x), (w1, w2))
    for g, e in zip(got, want):
        assert_close(g, e, torch.float32)


def test_meta_rejects_a_mismatched_grad():
    from kiln.meta.tensor_meta import TensorMeta
    g = TensorMeta.contiguous((2, 5, 6, 6), torch.float32, torch.device("cpu"))
    x = TensorMeta.contiguous((2, 3, 8, 8), torch.float32, torch.device("cpu"))
    w = TensorMeta.contiguous((4, 3, 3, 3), torch.float32, torch.device("cpu"))
    with pytest.raises(conv_ops.ConvBackwardError, match="does not fit"):
        conv_ops._conv_backward_meta(g, x, w, (1, 1), (0, 0), (1, 1), 1, (True, True, False))
    with pytest.raises(conv_ops.ConvBackwardError, match="at least one"):
        conv_ops._conv_backward_meta(g, x, w, (1, 1), (0, 0), (1, 1), 1, (False, False, False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("conv", [(1, 8, 16, 3), (1, 8, 16, 1), (16, 16, 16, 3), (16, 16, 16, 1), (1, 3, 16, 3)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_meta_strides_are_the_librarys(conv, dtype, layout):
    """The meta's gradient strides, size-1 dims included, are those this host's torch gives:
    oneDNN where it runs (fp32; bf16 on AVX-512; fp16 on AVX512-FP16 or AMX-FP16), torch's own
    fallback elsewhere (bf16 on an AVX2 host gave a depthwise weight gradient (9, 9, 3, 1), and
    the meta said (9, 1, 3, 1); fp16 on an H100 host's Xeon was oneDNN's)."""
    from kiln.meta.tensor_meta import TensorMeta
    groups, cin, cout, k = conv
    torch.manual_seed(0)
    x = torch.randn(2, cin, 12, 12, dtype=dtype)
    g = torch.randn(2, cout, 13 - k, 13 - k, dtype=dtype)
    if layout == "channels_last":
        x, g = x.to(memory_format=torch.channels_last), g.to(memory_format=torch.channels_last)
    w = torch.randn(cout, cin // groups, k, k, dtype=dtype)
    gi, gw = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0],
                                                 groups, [True, True, False])[:2]
    metas = [TensorMeta(t.shape, t.stride(), t.dtype, t.device, False) for t in (g, x, w)]
    mi, mw = conv_ops._conv_backward_meta(*metas, (1, 1), (0, 0), (1, 1), groups, (True, True, False))
    assert (tuple(mi.stride), tuple(mw.stride)) == (gi.stride(), gw.stride())
