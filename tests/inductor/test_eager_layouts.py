"""Library calls get their operands in the layout eager would hand them (inductor/layout.py).

ConvNeXt's blocks keep channels-last activations (``x.permute(0, 2, 3, 1)`` around the
LayerNorm and the MLP, then ``gamma * r + x``), so eager's depthwise 7x7 convolution reads a
channels-last input: cuDNN's NHWC kernel on the H200. kiln used to store that sum contiguous,
which sent the convolution down torch's generic depthwise kernel, 3.5x slower. The convolution's
arguments are recorded at eager's ``nn.Conv2d`` (a forward hook) and at kiln's library call
(``torch.convolution``, the ATen op both reach)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):  # torchvision's ConvNeXt LayerNorm2d
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Block(nn.Module):  # torchvision's CNBlock, without stochastic depth
    def __init__(self, d):
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.rand(d, 1, 1))

    def forward(self, x):
        r = self.dw(x).permute(0, 2, 3, 1)
        r = self.fc2(F.gelu(self.fc1(self.norm(r)))).permute(0, 3, 1, 2)
        return self.gamma * r + x


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, d, 4, stride=4), LayerNorm2d(d))
        self.blocks = nn.Sequential(Block(d), Block(d))

    def forward(self, x):
        return self.blocks(self.stem(x))


def _record_kiln_convs(monkeypatch):
    """The arguments of kiln's convolution calls (the wrapper calls ``torch.convolution``
    itself, or through ``prims_nn._conv_eager``: both look it up on torch at call time)."""
    real = torch.convolution
    calls = []

    def convolution(x, w, *args, **kwargs):
        out = real(x, w, *args, **kwargs)
        calls.append((tuple(x.shape), x.stride(), w.stride(), out.stride()))
        return out
    monkeypatch.setattr(torch, "convolution", convolution)
    return calls


def _eager_convs(m, x):
    calls = []

    def hook(mod, args, out):
        calls.append((tuple(args[0].shape), args[0].stride(), mod.weight.stride(), out.stride()))
    handles = [c.register_forward_hook(hook) for c in m.modules() if isinstance(c, nn.Conv2d)]
    try:
        return m(x), calls
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("target", TARGETS)
def test_convnext_convolutions_see_eager_layouts(target, monkeypatch):
    torch.manual_seed(0)
    with on_target(target) as device, torch.no_grad():
        m = Net().to(device).eval()
        x = torch.randn(2, 3, 32, 32, device=device)
        ref, eager_calls = _eager_convs(m, x)
        calls = _record_kiln_convs(monkeypatch)
        out = kiln.compile(m)(x)
        assert_close(out, ref, torch.float32)
        assert out.stride() == ref.stride()  # a graph output has eager's strides (issue 24)
        # every depthwise convolution reads a channels-last input, as in eager
        assert [c[1] for c in eager_calls][1:] == [(512, 1, 64, 8)] * 2
        assert calls == eager_calls, (calls, eager_calls)


def test_contiguous_layouts_without_the_hint(monkeypatch):
    """The A/B switch: with config.eager_layouts off the sum is stored contiguous (the old
    behaviour, which this test pins so the one above is known to test something)."""
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 3, 32, 32)
    calls = _record_kiln_convs(monkeypatch)
    with torch.no_grad(), kiln.config.patch(eager_layouts=False):
        kiln.reset()
        out = kiln.compile(m)(x)
    kiln.reset()
    assert_close(out, m(x), torch.float32)
    assert calls[2][1] == (512, 64, 8, 1)


@pytest.mark.parametrize("target", TARGETS)
def test_convnext_training_matches_eager(target):
    """Saved activations stored channels-last for a convolution still reach the backward with
    the strides kiln's metas promised (lower._output_ref copies them out)."""
    torch.manual_seed(0)
    with on_target(target) as device:
        m = Net().to(device)
        x = torch.randn(2, 3, 32, 32, device=device)
        ref = m(x)
        ref.square().mean().backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        out = kiln.compile(m)(x)
        out.square().mean().backward()
        assert_close(out, ref, torch.float32)
        for p, g in zip(m.parameters(), grads):
            assert_close(p.grad, g, torch.float32)


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (0, 3, 1, 2), (1, 0, 2, 3)])
def test_elementwise_over_permuted_inputs_is_right(perm):
    """The hint moves where a value is stored, never what it holds: an elementwise op over
    permuted inputs, fed to a library call and returned."""
    torch.manual_seed(0)
    w = torch.randn(5, 5, 3, 3)

    def f(a, b):
        s = torch.relu(a.permute(*perm) * 2 + b.permute(*perm))
        return F.conv2d(s, w, padding=1), s + 1
    a = torch.randn(*[(4, 5, 6, 7)[perm.index(d)] for d in range(4)])  # a.permute(perm): 4x5x6x7
    b = torch.randn_like(a)
    out = kiln.compile(f)(a, b)
    ref = f(a, b)
    for o, r in zip(out, ref):
        assert_close(o, r, torch.float32)


def test_rotary_attention_keeps_the_heads_layout():
    """q and k after a rotary embedding over ``x.view(B, T, H, D).transpose(1, 2)`` are laid
    out [B, T, H, D] in eager; so they are stored here, attention's result follows them
    (``layout_dependent=True`` on prims.sdpa) and ``y.transpose(1, 2).reshape(B, T, C)`` is a
    view: the rotary kernel is the only kernel. Stored contiguous, a second kernel copies y."""
    B, T, H, D = 2, 16, 4, 8
    torch.manual_seed(0)
    w = torch.randn(H * D, 3 * H * D) / 8
    cos, sin = torch.randn(T, D), torch.randn(T, D)

    def rot(x):
        a, b = x.chunk(2, -1)
        return torch.cat((-b, a), -1)

    def f(x):
        q, k, v = (x @ w).split(H * D, 2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, T, H * D) @ w[:, :H * D]
    x = torch.randn(B, T, H * D)
    counts = {}
    with torch.no_grad():
        for on in (True, False):
            with kiln.config.patch(eager_layouts=on):
                out = kiln.explain(f)(x)
            assert_close(out.result, f(x), torch.float32)
            counts[on] = len(out.kernels)
    assert counts == {True: 1, False: 2}, counts


@pytest.mark.parametrize("case", range(6))
def test_hint_matches_tensor_iterator(case):
    """layout.layout_hint for an elementwise op gives the strides eager's TensorIterator gives
    (or None where those are contiguous)."""
    from kiln.inductor import ir
    from kiln.inductor.layout import layout_hint
    from kiln.inductor.lowering import TValue
    from kiln.meta.tensor_meta import TensorMeta
    from kiln.ops import prims
    shape = (2, 3, 4, 5)
    perms = [((0, 2, 3, 1), (0, 2, 3, 1)), ((0, 2, 3, 1), None), (None, (0, 2, 3, 1)),
             ((3, 2, 1, 0), None), ((1, 0, 2, 3), (0, 1, 3, 2)), ("bcast", (0, 2, 3, 1))][case]

    def make(p):
        if p is None:
            return torch.randn(shape)
        if p == "bcast":
            return torch.randn(1, 3, 1, 1).expand(shape)
        inv = [p.index(d) for d in range(4)]
        return torch.randn([shape[d] for d in p]).permute(*inv)
    a, b = make(perms[0]), make(perms[1])
    assert a.shape == b.shape == shape
    want = (a + b).stride()
    args = [TValue.of_ref(ir.TensorRef(f"x{i}", t.shape, t.stride(), 0), t.dtype, t.device)
            for i, t in enumerate((a, b))]
    got = layout_hint(prims.add, TensorMeta.contiguous(shape, torch.float32, torch.device("cpu")), args)
    assert (got or torch.empty(shape).stride()) == want, (got, want)


_CAT_PAD_CASES = [  # (operand shape as stored, permutation to the logical view, op)
    ((1, 16, 64), (0, 2, 1), "cat"),        # RoPE's frequency table: transposed, 3-d
    ((4, 5, 6), (2, 0, 1), "pad"),
    ((2, 8, 8, 3), (0, 3, 1, 2), "cat"),    # channels-last 4-d: kept
    ((2, 8, 8, 3), (0, 3, 1, 2), "pad"),
    ((2, 3, 5, 4), (0, 1, 3, 2), "cat"),    # a 4-d transpose that is not channels-last
    ((2, 4, 4, 4, 3), (0, 4, 1, 2, 3), "cat"),  # channels_last_3d: kept
]


@pytest.mark.parametrize("case", range(len(_CAT_PAD_CASES)))
def test_cat_and_pad_hints_match_eager_memory_format(case):
    """A cat's or a pad's result keeps its operands' order only where that is a channels-last
    memory format, as eager's suggest_memory_format does; any other shared order (RoPE's
    transposed [1, 64, 16] table) is contiguous in eager, and kiln hinted it transposed."""
    from kiln.inductor import ir
    from kiln.inductor.layout import layout_hint
    from kiln.inductor.lowering import TValue
    from kiln.meta.tensor_meta import TensorMeta
    from kiln.ops import prims
    stored, perm, op = _CAT_PAD_CASES[case]
    t = torch.randn(stored).permute(*perm)
    tv = TValue.of_ref(ir.TensorRef("x0", t.shape, t.stride(), 0), t.dtype, t.device)
    if op == "cat":
        want = torch.cat((t, t), 1)
        target, args = prims.cat, [[tv, tv], 1]
    else:
        want = F.pad(t, (1, 1))
        target, args = prims.pad, [tv, (1, 1)]
    meta = TensorMeta.contiguous(tuple(want.shape), torch.float32, torch.device("cpu"))
    got = layout_hint(target, meta, args)
    assert (got or torch.empty(want.shape).stride()) == want.stride(), (got, want.stride())
