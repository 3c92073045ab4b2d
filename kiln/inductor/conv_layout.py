"""Channels-last activations for convolution nets on CUDA (``config.conv_layout``).

Eager runs a conv net in the layout its input comes in, NCHW for an image batch, and on that
layout cuDNN falls back to slow kernels: torch's generic depthwise kernel for a depthwise
convolution, ``implicit_convolve_sgemm`` with NCHW<->NHWC transposes around it for a 1x1 one.
torch.compile turns such graphs channels-last (Inductor's layout optimization); measured on the
H200, MobileNetV3-L's device time was 0.91 ms under torch.compile against kiln's 1.50 ms,
most of the gap in those kernels (docs/notes/session-25.md).

So when a graph's convolutions pay for it, lowering hands each 4-d convolution its input in
channels-last order (``realize_channels_last``). cuDNN then returns a channels-last result, the
pointwise ops after it (batch norm, activations, residual adds) follow their operands' layout
(``layout.py``), and the next convolution finds its input channels-last without a copy; the
graph's outputs are still stored with eager's strides (``lower._realize_output``). Values never
change, only where they are stored.

In a training forward the saved activations keep the layouts lowering gives them
(``lower._realize_saved``) instead of being copied back to eager's for the backward, which is
compiled (and speculated) for those real strides; its grads still get the strides the partition
promised, eager's (``pipeline.promised_strides``).

When it pays (``wants_channels_last``): on CUDA, a graph with 2-d convolutions over static
shapes, without gradients (an inference graph: training graphs keep eager's layouts under
"auto" until the channels-last training path is measured on the device; "channels_last" forces
it for them too), unless grouped convolutions
with several channels per group carry a large share of the work (channels-last makes those
slower in cuDNN) or every convolution is tiny (at most 64 channels in and out: the copies then
cost more than the kernels save). Depthwise convolutions (one channel per group) gain the most.
"""
from __future__ import annotations

import sys

from kiln.config import config
from kiln.graph.node import CALL
from kiln.meta.symbolic import has_symbols
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.registry import bind_stage


# grouped (not depthwise) convolutions slow down channels-last; above this share of a graph's
# multiply-adds the graph keeps eager's layout
GROUPED_SHARE_LIMIT = 0.3


def channels_last_strides(shape) -> tuple:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _conv_macs(x: TensorMeta, w: TensorMeta, out: TensorMeta) -> int:
    # multiply-adds: every output element sums (in channels per group) x kernel area products
    per_out = 1
    for s in w.shape[1:]:
        per_out *= s
    total = per_out
    for s in out.shape:
        total *= s
    return total


def wants_channels_last(graph, device) -> bool:
    """Whether lowering stores this graph's convolution inputs channels-last (module doc)."""
    mode = config.conv_layout
    if mode == "eager" or device is None:
        return False
    convs = [n for n in graph.nodes if n.op == CALL and n.target is prims.conv]  # args (x, weight, ..., groups last)
    if not convs:
        return False
    metas = []
    for n in convs:
        x, w, out = n.args[0].meta.get("val"), n.args[1].meta.get("val"), n.meta.get("val")
        if not all(isinstance(t, TensorMeta) for t in (x, w, out)) or len(x.shape) != 4:
            return False
        if has_symbols(tuple(x.shape) + tuple(out.shape)):
            return False
        metas.append((x, w, out))
    if mode == "channels_last":
        return True
    if device.type != "cuda":
        return False
    if getattr(graph, "saves_for_backward", False):  # not yet measured on the device (module doc)
        return False
    total = grouped = 0
    for x, w, out in metas:
        macs = _conv_macs(x, w, out)
        total += macs
        groups = x.shape[1] // w.shape[1]
        if groups > 1 and w.shape[1] > 1:
            grouped += macs
    if total == 0 or grouped > GROUPED_SHARE_LIMIT * total:
        return False
    return not all(w.shape[0] <= 64 and x.shape[1] <= 64 for x, w, _ in metas)


def realize_channels_last(ctx, x):
    """``x`` as a TValue stored channels-last (a kernel walking memory in order), copying a
    value that already sits in a buffer laid out otherwise."""
    from kiln.inductor.lowering import TValue
    want = channels_last_strides(x.shape)
    if x.ref is not None:
        have = tuple(x.ref.stride)
        if all(n == 1 or a == b for n, a, b in zip(x.shape, have, want)):
            return x
        x = TValue(x.shape, x.dtype, x.device, x.loader, None, x.origins)
    ref = ctx.realize(x, want, in_order=True)
    return TValue.of_ref(ref, x.dtype, x.device, x.origins)


def add_channel_bias(out, bias):
    """``out + bias`` over the channel dim (dim 1) as an unrealized value in ``out``'s layout:
    the kernel that reads it adds the bias (a convolution's, split off the library call)."""
    from kiln.inductor import ir
    from kiln.inductor.lowering import TValue
    from kiln.inductor.layout import _hint

    def load(idx):
        return ir.Call("add", (out.loader(idx), bias.loader([idx[1]])), out.dtype)
    value = TValue(out.shape, out.dtype, out.device, load, None, out.origins)
    value.layout = _hint(out.shape, tuple(out.ref.stride))  # stored as the library stores it
    return value


def symbolic(meta) -> bool:
    """Sizes or strides with symbols: the layout rules here compare them, so they keep out."""
    return has_symbols(tuple(meta.shape) + tuple(meta.stride))


def splits_bias(device) -> bool:
    """Whether a convolution's bias is added by the kernel after it (``add_channel_bias``):
    on CUDA, and wherever ``conv_layout="channels_last"`` forces CUDA's treatment (tests)."""
    return device.type == "cuda" or config.conv_layout == "channels_last"


# The op files write their lowerings with this module's builders through a stage handle
# (ops/registry.py: the ops layer imports no stage); binding it resolves them.
bind_stage("conv_layout", sys.modules[__name__])
