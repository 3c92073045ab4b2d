"""Training steps of conv nets keep channels-last layouts (inductor/lower.py ``_realize_saved``,
autograd/function.py): a training step over a channels-last input or model, and one where
``conv_layout="channels_last"`` turns an NCHW net channels-last inside the graph, give eager's
loss, every gradient, and every gradient's strides; in the second case the saved activations
stay channels-last (no copy back to NCHW for the backward), and the backward is compiled once,
for those layouts, also when it is speculated during the forward's build."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from kiln.autograd import function
from testing import assert_close


class Net(nn.Module):  # conv-bn-relu, a depthwise conv-bn with a residual, a 1x1 conv
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.b2 = nn.BatchNorm2d(16)
        self.pw = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = F.hardswish(self.b2(self.dw(h))) + h
        return self.pw(h).mean((2, 3))


class ConvBackwardInputs(TorchDispatchMode):
    """The layout of every input the backward's convolutions read (``aten.convolution_backward``)."""

    def __init__(self):
        super().__init__()
        self.inputs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution_backward.default:
            self.inputs.append(args[1].is_contiguous(memory_format=torch.channels_last))
        return func(*args, **(kwargs or {}))


def _step(model, x, compiled):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    fn = kiln.compile(lambda x: model(x).square().sum()) if compiled else (lambda x: model(x).square().sum())
    loss = fn(x)
    loss.backward()
    return loss.detach(), [x.grad] + [p.grad for p in model.parameters()]


def _check(model, x, dtype=torch.float32):
    torch.manual_seed(0)
    model = model.to(dtype).train()
    ref = copy.deepcopy(model)
    x = x.to(dtype)
    want_loss, want = _step(ref, x, compiled=False)
    kiln.reset()
    got_loss, got = _step(model, x, compiled=True)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got_loss, want_loss, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
        assert g.stride() == w.stride(), (g.shape, g.stride(), w.stride())  # eager's, exactly
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0


def _input(kind):
    x = torch.randn(2, 3, 12, 12)
    if kind == "channels_last":
        return x.to(memory_format=torch.channels_last)
    if kind == "strided":
        return torch.randn(2, 3, 12, 24)[..., ::2]
    return x


@pytest.mark.parametrize("model_format", ["contiguous", "channels_last"])
@pytest.mark.parametrize("kind", ["contiguous", "channels_last", "strided"])
def test_training_step_matches_eager_with_eager_layouts(kind, model_format):
    model = Net()
    if model_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    _check(model, _input(kind))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["contiguous", "channels_last"])
def test_training_step_matches_eager_with_channels_last_convs(kind, dtype):
    with kiln.config.patch(conv_layout="channels_last"):
        _check(Net(), _input(kind), dtype)


def test_saved_activations_stay_channels_last_and_the_backward_compiles_once(monkeypatch):
    calls = []
    real = function.compile_backward

    def counting(part, compiler, metas):
        calls.append([tuple(m.stride) for m in metas])
        return real(part, compiler, metas)
    monkeypatch.setattr(function, "compile_backward", counting)
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(2, 3, 12, 12)
    for speculate in (False, True):
        calls.clear()
        kiln.reset()
        with kiln.config.patch(conv_layout="channels_last", speculative_backward=speculate, graph_cache=False):
            loss = kiln.compile(lambda x: model(x).sum())(x)
            with ConvBackwardInputs() as seen:
                loss.backward()
        assert len(calls) == 1, calls  # the speculation compiled it for the layouts the forward saved
        # the activations channels-last; the stem's input (the last in the backward) is the
        # graph's own NCHW input, saved as it came
        assert seen.inputs == [True, True, False], seen.inputs
        saved_4d = [s for s in calls[0] if len(s) == 4 and s[1] == 1]
        assert len(saved_4d) >= 4, calls[0]  # conv, bn and relu outputs saved channels-last


def test_a_non_conv_training_graph_saves_with_its_metas_strides():
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 6, 8).transpose(0, 1)  # a non-contiguous input
    want = lin(x).relu().sum(0)
    kiln.reset()
    with kiln.config.patch(conv_layout="channels_last"):
        got = kiln.compile(lambda x: lin(x).relu().sum(0))(x)
    assert_close(got, want)
    got.sum().backward()
    assert lin.weight.grad is not None
