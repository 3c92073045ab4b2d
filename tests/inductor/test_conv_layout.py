"""Channels-last convolution inputs for conv nets (inductor/conv_layout.py).

``config.conv_layout="channels_last"`` forces on this CPU what "auto" does for CUDA inference
graphs: each 4-d convolution gets its input channels-last, the pointwise ops after it follow,
and the graph's outputs keep eager's strides. The values must be eager's whatever the layout,
in inference and in training, for fp32 and bf16, contiguous, channels-last and non-contiguous
inputs."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from kiln.graph.graph import Graph
from kiln.inductor import conv_layout
from testing import TARGETS, assert_close, on_target


class Block(nn.Module):  # a MobileNetV2-style inverted residual: 1x1, depthwise 3x3, 1x1
    def __init__(self, c, hidden):
        super().__init__()
        self.expand = nn.Conv2d(c, hidden, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.dw = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.project = nn.Conv2d(hidden, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)

    def forward(self, x):
        h = F.relu6(self.bn1(self.expand(x)))
        h = F.hardswish(self.bn2(self.dw(h)))
        return x + self.bn3(self.project(h))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(Block(8, 24), Block(8, 24))
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.blocks(F.relu(self.stem(x)))
        return self.head(h.mean((2, 3))), h  # a 4-d output too: its strides must be eager's


class ConvInputs(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.strides = []
        self.biases = []
        self.weights_channels_last = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.strides.append((tuple(args[0].shape), args[0].stride()))
            self.biases.append(args[2] is not None)
            self.weights_channels_last.append(args[1].is_contiguous(memory_format=torch.channels_last))
        return func(*args, **(kwargs or {}))


def _inputs(kind, dtype):
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    if kind == "channels_last":
        return x.to(memory_format=torch.channels_last)
    if kind == "strided":
        return torch.randn(2, 3, 16, 32, dtype=dtype)[..., ::2]
    return x


@pytest.mark.parametrize("kind", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_matches_eager_with_channels_last_convs(kind, dtype):
    torch.manual_seed(0)
    model = Net().eval().to(dtype)
    x = _inputs(kind, dtype)
    with torch.no_grad():
        expected = model(x)
        kiln.reset()
        with kiln.config.patch(conv_layout="channels_last"):
            compiled = kiln.compile(model)
            compiled(x)
            rec = ConvInputs()
            with rec:
                actual = compiled(x)
    for a, e in zip(actual, expected):
        if dtype == torch.bfloat16:  # convolutions in another layout round in another order
            torch.testing.assert_close(a, e, rtol=3e-2, atol=3e-2)
        else:
            assert_close(a, e)
        assert a.dtype == e.dtype and a.stride() == e.stride()
    assert len(rec.strides) == 7
    assert not any(rec.biases)  # the stem's bias is added by the kernel after it (CUDA's way)
    # every weight reaches the library channels-last: the stem's 3x3 one copied by a kiln kernel
    # (cuDNN would copy it on every call), the 1x1 and depthwise ones as they are
    assert all(rec.weights_channels_last), rec.weights_channels_last
    for shape, stride in rec.strides:
        assert stride == conv_layout.channels_last_strides(shape), (shape, stride)
    assert kiln.stats()["fallbacks"] == 0


def test_training_step_matches_eager_with_channels_last_convs():
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(4, 3, 16, 16)

    def step(x):
        logits, h = model(x)
        return logits.square().sum() + h.mean()
    loss = step(x)
    loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    kiln.reset()
    with kiln.config.patch(conv_layout="channels_last"):
        got = kiln.compile(step)(x)
        got.backward()
    assert_close(got, loss)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)


def _graph_with_conv(x_shape, w_shape, groups=1, saves=False):
    from kiln.meta.tensor_meta import TensorMeta
    from kiln.ops import prims_nn
    g = Graph()
    x = g.placeholder("x", TensorMeta.contiguous(x_shape, torch.float32, torch.device("cuda")))
    w = g.placeholder("w", TensorMeta.contiguous(w_shape, torch.float32, torch.device("cuda")))
    out = g.call(prims_nn.conv, (x, w, None, (1, 1), (1, 1), (1, 1), groups))  # meta: its rule
    g.output((out,))
    g.saves_for_backward = saves
    return g


def test_auto_picks_channels_last_for_cuda_inference_convs_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    dw = _graph_with_conv((8, 96, 28, 28), (96, 1, 3, 3), groups=96)  # depthwise: pays most
    assert conv_layout.wants_channels_last(dw, cuda)
    assert not conv_layout.wants_channels_last(dw, cpu)  # oneDNN: eager's layouts
    assert not conv_layout.wants_channels_last(_graph_with_conv((8, 96, 28, 28), (96, 1, 3, 3), 96, True), cuda)
    grouped = _graph_with_conv((8, 96, 28, 28), (96, 24, 3, 3), groups=4)  # slower channels-last
    assert not conv_layout.wants_channels_last(grouped, cuda)
    tiny = _graph_with_conv((8, 16, 28, 28), (32, 16, 3, 3))
    assert not conv_layout.wants_channels_last(tiny, cuda)
    with kiln.config.patch(conv_layout="eager"):
        assert not conv_layout.wants_channels_last(dw, cuda)


def test_ensure_layout_views_a_result_whose_strides_differ_only_on_size_one_dims():
    from kiln.inductor.codegen.wrapper import ensure_layout
    t = torch.randn(4, 8, 1, 1).to(memory_format=torch.channels_last)  # strides (8, 1, 8, 8)
    out = ensure_layout(t, (4, 8, 1, 1), (8, 1, 1, 1))
    assert out.stride() == (8, 1, 1, 1) and out.data_ptr() == t.data_ptr()
    assert torch.equal(out, t)
    other = torch.randn(4, 8, 3, 3)
    copied = ensure_layout(other, (4, 8, 3, 3), (72, 1, 24, 8))
    assert copied.stride() == (72, 1, 24, 8) and copied.data_ptr() != other.data_ptr()
    assert torch.equal(copied, other)


def test_symbolic_sizes_keep_the_bias_in_the_library_call():
    # the layout rules compare strides: with symbolic sizes they stay out (a torchvision
    # ConvNeXt resumed at a graph break with dynamic sizes raised in lowering on the H200)
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1).eval()
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(conv_layout="channels_last"):
        compiled = kiln.compile(lambda x: F.relu(conv(x)), dynamic=True)
        for size in (8, 12, 16):
            x = torch.randn(2, 3, size, size)
            assert_close(compiled(x), F.relu(conv(x)))
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats.get("eager_runs", 0) == 0, stats


class Stem(nn.Module):  # ResNet's: 7x7/2 conv, batch norm, ReLU, 3x3/2 max pool, and a cat
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.side = nn.Conv2d(16, 8, 1, bias=False)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, 1)
        return self.side(torch.cat([h, F.pad(h, (1, 1, 1, 1))[..., 1:-1, 1:-1] * 2], 1)[:, :16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["contiguous", "channels_last"])
def test_a_pad_and_a_cat_over_channels_last_values_stay_channels_last(dtype, kind):
    """The max pool's padded input, a pad and a cat of channels-last activations are stored
    channels-last (layout.py): a contiguous copy would read the activation across channels."""
    torch.manual_seed(0)
    model = Stem().eval().to(dtype)
    x = _inputs(kind, dtype)
    with torch.no_grad():
        expected = model(x)
        kiln.reset()
        with kiln.config.patch(conv_layout="channels_last"):
            out = kiln.explain(model)(x)
            actual = kiln.compile(model)(x)
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(actual, expected, **tol)
    assert actual.stride() == expected.stride()
    src = "\n".join(str(w) for w in out.wrappers)
    # buffers are allocated in memory order (the wrapper views them with as_strided): a
    # channels-last buffer has its channels innermost; the padded max-pool input was
    # (2, 16, 10, 10), read across channels from the (2, 16, 8, 8) channels-last activation
    allocs = [tuple(map(int, a)) for a in
              re.findall(r"empty_strided\(\((\d+), (\d+), (\d+), (\d+)\)", src)]
    inner = [a for a in allocs if a != tuple(expected.shape)]
    assert inner and all(a[-1] in (3, 16, 32) for a in inner), src
    assert kiln.stats()["fallbacks"] == 0


class StemPool(nn.Module):  # conv, batch norm, ReLU, a max pool, two 1x1 convs (ResNet's block and shortcut)
    def __init__(self, kernel, stride):
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(12)
        self.kernel, self.stride = kernel, stride
        self.side = nn.Conv2d(12, 8, 1, bias=False)
        self.shortcut = nn.Conv2d(12, 8, 1, bias=False)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), self.kernel, self.stride, 1)
        return self.side(h) + self.shortcut(h)


def _padded_buffers(model, x, target):
    with torch.no_grad(), on_target(target), kiln.config.patch(conv_layout="channels_last"):
        kiln.reset()
        out = kiln.explain(model)(x)
        actual = kiln.compile(model)(x)
    src = "\n".join(str(w) for w in out.wrappers)
    allocs = [tuple(map(int, a)) for a in re.findall(r"empty_strided\(\((\d+), (\d+), (\d+), (\d+)\)", src)]
    # the pool's result goes on to the 1x1 convolutions channels-last, never stored NCHW and
    # copied (a window over the unstored padded input keeps its channels-last order: layout.py)
    oh = (x.shape[-1] + 2 - model.kernel) // model.stride + 1
    assert (x.shape[0], 12, oh, oh) not in allocs, src
    # the padded input, in memory order (n, h + 2, w + 2, c)
    h = x.shape[-1] + 2
    return actual, [a for a in allocs if h in a]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["contiguous", "channels_last"])
def test_a_max_pools_padded_input_is_recomputed_in_the_pool_kernel(target, dtype, kind):
    """ResNet's stem: bn+relu+pad before the 3x3/2 max pool is read by nine windows. For Triton
    kernels it is recomputed in the pool's kernel instead of stored (a 53 MB buffer at batch 32
    bf16 on the H200); C++ kernels keep it stored (their masked loads would not vectorize), and
    so does a window that reads each input more than four times (3x3 stride 1)."""
    torch.manual_seed(0)
    x = _inputs(kind, dtype).to(target[0])  # .to keeps the channels-last strides
    for (kernel, stride), recomputed in (((3, 2), target[1] == "triton"), ((3, 1), False)):
        model = StemPool(kernel, stride).eval().to(target[0], dtype)
        with torch.no_grad():
            expected = model(x)
        actual, padded = _padded_buffers(model, x, target)
        if dtype == torch.bfloat16:
            tol = dict(rtol=3e-2, atol=3e-2)
        elif target[0] == "cuda":  # TF32 convolutions: eager's NCHW and kiln's channels-last algorithms
            tol = dict(rtol=1e-2, atol=5e-3)
        else:
            tol = {}
        torch.testing.assert_close(actual, expected, **tol)
        assert actual.dtype == expected.dtype and actual.stride() == expected.stride()
        assert (not padded) == recomputed, (kernel, stride, padded)
    assert kiln.stats()["fallbacks"] == 0
