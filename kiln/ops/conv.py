"""Convolution's backward as one library call.

``conv_backward(g, x, weight, stride, padding, dilation, groups, mask)`` returns the gradients
of a ``core.conv`` for the input, the weight and the bias, those whose ``mask`` entry is true,
in that order. It calls ``aten.convolution_backward``: cuDNN on CUDA, oneDNN or the native
kernels on the CPU, the same kernels eager autograd runs.

Why not the decomposed form (``config.conv_library_backward=False``, kept for an A/B): the
input's gradient as a transposed convolution has to spread the output gradient with zeros for
a stride above 1 (4x the memory and the work at stride 2), and the weight's gradient as a
convolution with batch and channels swapped has a "kernel" the size of the output image, which
no library tunes for: a ResNet-18 training step took twice eager's time that way
(docs/notes/measurements.md).

Like fused attention, the op exists as a core op (the joint graph holds it) and as a library
prim of the same name, lowered to one wrapper call with one buffer per result
(``lowering.extern_multi_rule``).
"""
from __future__ import annotations

import functools

import torch

from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops.prims_nn import _channels_last, _channels_last_strides
from kiln.ops.registry import DECOMPOSITIONS, LOWERINGS, META_RULES, define, stage_api

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported


__all__ = ["conv_backward", "prim_conv_backward"]


class ConvBackwardError(TypeError):
    pass


def _conv_backward_eager(g, x, weight, stride, padding, dilation, groups, mask):
    nd = x.dim() - 2
    bias_sizes = [weight.shape[0]] if mask[2] else None
    grads = torch.ops.aten.convolution_backward(
        g, x, weight, bias_sizes, list(stride), list(padding), list(dilation), False, [0] * nd,
        groups, list(mask))
    return tuple(t for t, wanted in zip(grads, mask) if wanted)


def _conv_backward_meta(g, x, weight, stride, padding, dilation, groups, mask):
    if len(mask) != 3 or not any(mask):
        raise ConvBackwardError(f"[meta] prims.conv_backward: mask {mask} must name at least one of "
                                f"(input, weight, bias)")
    if x.ndim not in (3, 4, 5) or weight.ndim != x.ndim or g.ndim != x.ndim:
        raise ConvBackwardError(f"[meta] prims.conv_backward: grad {list(g.shape)}, input {list(x.shape)}, "
                                f"weight {list(weight.shape)}")
    if g.shape[0] != x.shape[0] or g.shape[1] != weight.shape[0]:
        raise ConvBackwardError(f"[meta] prims.conv_backward: grad {list(g.shape)} does not fit input "
                                f"{list(x.shape)} and weight {list(weight.shape)}")
    out = []
    # the library gives both gradients the convolution's memory format, channels-last when the
    # input or the weight is (torch's suggest-memory-format rule, as for the forward's result),
    # else contiguous: size-1 dims get torch's strides too (a 1x1 kernel's grad is (C, 1, 1, 1))
    cl = _channels_last(x) or _channels_last(weight)

    def layout(t):
        return _channels_last_strides(t.shape) if cl else contiguous_strides(t.shape)
    if mask[0]:
        out.append(TensorMeta(x.shape, layout(x), x.dtype, x.device, False))
    if mask[1]:
        w_strides = layout(weight)
        if cl and _cpu_fallback_conv(weight):
            # the fallback's weight gradient has the contiguous strides on its size-1 dims
            # (a depthwise 3x3's [16, 1, 3, 3] is (9, 9, 3, 1), oneDNN's (9, 1, 3, 1))
            w_strides = tuple(c if n == 1 else s for n, s, c in
                              zip(weight.shape, w_strides, contiguous_strides(weight.shape)))
        out.append(TensorMeta(weight.shape, w_strides, weight.dtype, weight.device, False))
    if mask[2]:
        out.append(TensorMeta.contiguous((weight.shape[0],), g.dtype, g.device))
    return tuple(out)


def _cpu_fallback_conv(t) -> bool:
    """Whether this host's torch runs a CPU convolution of ``t``'s dtype in its own fallback
    rather than in oneDNN (fp32 always goes to oneDNN)."""
    if getattr(t.device, "type", None) != "cpu" or t.dtype not in (torch.bfloat16, torch.float16):
        return False
    return _fallback_probe(t.dtype)


@functools.cache
def _fallback_probe(dtype) -> bool:
    """Asks the library once per dtype: a channels-last depthwise 3x3 weight gradient is
    (9, 9, 3, 1) from torch's fallback and (9, 1, 3, 1) from oneDNN. Which one runs depends on
    the ISA in a way torch does not expose whole (bf16 needs AVX-512; fp16 takes AVX512-FP16 or
    AMX-FP16: an H100 host's Xeon ran oneDNN in fp16 where ``_is_amx_fp16_supported`` said no),
    so the probe asks the kernel itself rather than guessing from CPU flags."""
    cl = torch.channels_last
    x = torch.zeros(1, 2, 4, 4, dtype=dtype).to(memory_format=cl)
    g = torch.zeros(1, 2, 2, 2, dtype=dtype).to(memory_format=cl)
    w = torch.zeros(2, 1, 3, 3, dtype=dtype)
    try:
        gw = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0],
                                                 2, [False, True, False])[1]
    except RuntimeError:  # no CPU kernel for this dtype at all: the meta's layout is moot
        return False
    return gw.stride()[1] != 1


# layout_dependent: lowering runs the meta again on the operands as realized (a channels-last
# activation saved by the forward gives channels-last grads, with no copy)
prim_conv_backward = define("prims", "conv_backward", _conv_backward_eager, library=True,
                            layout_dependent=True)
META_RULES[prim_conv_backward] = _conv_backward_meta
LOWERINGS[prim_conv_backward] = L.extern_multi_rule
conv_backward = define("core", "conv_backward", _conv_backward_eager, differentiable=False)  # no double backward
META_RULES[conv_backward] = _conv_backward_meta
DECOMPOSITIONS[conv_backward] = prim_conv_backward
