"""Prims for indexing with tensors (gather, index_select) and library ops kept whole (bmm,
attention, convolution): the backend calls cuBLAS/cuDNN/flash attention through torch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops.registry import LOWERINGS, META_RULES, define, stage_api
from kiln.meta.strides import strides_like_channels_last
from kiln.meta.symbolic import has_symbols

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported
_pad_gemm = stage_api("pad_gemm")
_conv_layout = stage_api("conv_layout")


__all__ = ["gather", "index_select", "bmm", "sdpa", "sdpa_backward", "conv", "scatter_add", "index_add",
           "scatter_store", "index_copy", "rand", "full", "fallback"]


class NNPrimError(TypeError):
    pass


def _check_index(name, index):
    if index.dtype not in (torch.int64, torch.int32):
        raise NNPrimError(f"[meta] prims.{name}: index must be int64 or int32, got {index.dtype}")


# ------------------------------------------------------------------ indexing with tensors
gather = define("prims", "gather", lambda x, dim, index: torch.gather(x, dim, index))


@META_RULES.register(gather)
def _gather_meta(x, dim, index):
    _check_index("gather", index)
    if index.ndim != x.ndim:
        raise NNPrimError(f"[meta] prims.gather: index has {index.ndim} dims, input {x.ndim}")
    return TensorMeta.contiguous(index.shape, x.dtype, x.device, x.requires_grad)


LOWERINGS[gather] = L.gather_rule

index_select = define("prims", "index_select", lambda x, dim, index: torch.index_select(x, dim, index))


@META_RULES.register(index_select)
def _index_select_meta(x, dim, index):
    _check_index("index_select", index)
    if index.ndim != 1:
        raise NNPrimError(f"[meta] prims.index_select: index must be 1-d, got {index.ndim}-d")
    shape = list(x.shape)
    shape[dim] = index.shape[0]
    return TensorMeta.contiguous(shape, x.dtype, x.device, x.requires_grad)


LOWERINGS[index_select] = L.index_select_rule


# ------------------------------------------------------------------ library ops
# torch.bmm always returns a fresh row-major result
bmm = define("prims", "bmm", torch.bmm, library=True, fresh_result=True, exact_layout=True)


@META_RULES.register(bmm)
def _bmm_meta(a, b):
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise NNPrimError(f"[meta] prims.bmm: cannot multiply {list(a.shape)} by {list(b.shape)}")
    if a.dtype != b.dtype:
        raise NNPrimError(f"[meta] prims.bmm: dtypes differ ({a.dtype} vs {b.dtype})")
    shape = (a.shape[0], a.shape[1], b.shape[2])
    return TensorMeta(shape, contiguous_strides(shape), a.dtype, a.device, a.requires_grad or b.requires_grad)


LOWERINGS[bmm] = _pad_gemm.gemm_rule


def _sdpa_eager(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)


sdpa = define("prims", "sdpa", _sdpa_eager, library=True, layout_dependent=True, fresh_result=True)


@META_RULES.register(sdpa)
def _sdpa_meta(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim or q.shape[-1] != k.shape[-1] \
            or k.shape[-2] != v.shape[-2]:
        raise NNPrimError(f"[meta] prims.sdpa: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} "
                          "do not fit")
    shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    grad = q.requires_grad or k.requires_grad or v.requires_grad
    if q.ndim == 4 and q.stride[-1] == 1 and not dropout_p:
        # torch's fused kernels (flash, memory-efficient, cuDNN; flash on the CPU) return the
        # result laid out like q: over x.view(B, T, H, D).transpose(1, 2) that is [B, T, H, D]
        # memory, so the usual transpose(1, 2).reshape(B, T, C) after attention is a view. A
        # contiguous promise made the wrapper copy it to [B, H, T, D] and a kernel copy it back.
        # Its math kernel returns a contiguous result, which the meta then promises too.
        from kiln.ops.attention import _dense_like, fused_choice
        if fused_choice(q, k, v, attn_mask, is_causal, scale, grad=False) is not None:
            return TensorMeta(shape, _dense_like(shape, q), q.dtype, q.device, grad)
    return TensorMeta.contiguous(shape, q.dtype, q.device, grad)


LOWERINGS[sdpa] = L.extern_rule


def _sdpa_backward_eager(g, q, k, v, attn_mask=None, is_causal=False, scale=None):
    """The gradients of attention for q, k and v, packed as [3, *q.shape]. torch's own fused
    backward (flash, memory-efficient or math, whichever torch picks for these inputs) runs
    through autograd on a recomputed forward: one extra fused forward instead of the
    materialized [.., Lq, Lk] probabilities of a decomposed backward."""
    with torch.enable_grad():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=attn_mask, is_causal=is_causal,
                                             scale=scale)
        grads = torch.autograd.grad(out, (qq, kk, vv), g)
    return torch.stack(grads)


sdpa_backward = define("prims", "sdpa_backward", _sdpa_backward_eager, library=True)


@META_RULES.register(sdpa_backward)
def _sdpa_backward_meta(g, q, k, v, attn_mask=None, is_causal=False, scale=None):
    if not tuple(g.shape) == tuple(q.shape) == tuple(k.shape) == tuple(v.shape):
        raise NNPrimError(f"[meta] prims.sdpa_backward: g {list(g.shape)}, q {list(q.shape)}, "
                          f"k {list(k.shape)}, v {list(v.shape)} must have one shape")
    return TensorMeta.contiguous((3,) + tuple(q.shape), q.dtype, q.device, False)


LOWERINGS[sdpa_backward] = L.extern_rule


def _conv_eager(x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    # ``torch.convolution`` is the ATen op F.conv2d (1d, 3d) lands in with these arguments:
    # calling it skips one dispatcher layer, ~0.4 us of host time per convolution per call
    # (ResNet-50 has 53, and its bf16 inference on the H200 is bound by the host)
    nd = x.dim() - 2
    if nd not in (1, 2, 3) or weight.dim() != x.dim():
        fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}.get(x.dim(), F.conv2d)
        return fn(x, weight, bias, stride, padding, dilation, groups)  # eager's own error

    def full(p):
        p = tuple(p) if isinstance(p, (tuple, list)) else (p,)
        return p * nd if len(p) == 1 else p
    return torch.convolution(x, weight, bias, full(stride), full(padding), full(dilation), False,
                             (0,) * nd, groups)


def _conv_wrapper_call(inputs, args, kwargs, bound=None):
    """``torch.convolution``'s own call for a convolution whose arguments capture normalized
    (one entry per spatial dim, a static groups): ``_conv_eager``'s checks and tuple building
    cost ~1.5 us a convolution a call, and a host-bound ResNet-50 makes 53."""
    if kwargs or len(args) != 7 or len(inputs) != 7:
        return None
    x, w = inputs[0], inputs[1]
    stride, padding, dilation, groups = inputs[3:7]
    nd = len(getattr(x, "shape", ()) or ()) - 2
    if nd not in (1, 2, 3) or len(getattr(w, "shape", ()) or ()) != nd + 2 or type(groups) is not int \
            or not all(type(p) is tuple and len(p) == nd and all(type(v) is int for v in p)
                       for p in (stride, padding, dilation)):
        return None
    return (f"torch.convolution({args[0]}, {args[1]}, {args[2]}, {args[3]}, {args[4]}, {args[5]}, "
            f"False, {(0,) * nd!r}, {args[6]})")


conv = define("prims", "conv", _conv_eager, library=True, layout_dependent=True, fresh_result=True,
              wrapper_call=_conv_wrapper_call)


def conv_output_shape(x_shape, w_shape, stride, padding, dilation):
    spatial = []
    for k, size in enumerate(x_shape[2:]):
        eff = dilation[k] * (w_shape[2 + k] - 1) + 1
        spatial.append((size + 2 * padding[k] - eff) // stride[k] + 1)
    return (x_shape[0], w_shape[0], *spatial)


@META_RULES.register(conv)
def _conv_meta(x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    if x.ndim not in (3, 4, 5) or weight.ndim != x.ndim:
        raise NNPrimError(f"[meta] prims.conv: input {list(x.shape)} and weight {list(weight.shape)}")
    if x.shape[1] != weight.shape[1] * groups:
        raise NNPrimError(f"[meta] prims.conv: {x.shape[1]} input channels, weight expects "
                          f"{weight.shape[1]} x {groups} groups")
    shape = conv_output_shape(x.shape, weight.shape, stride, padding, dilation)
    if any(s <= 0 for s in shape[2:]):
        raise NNPrimError(f"[meta] prims.conv: output size {list(shape)} is too small")
    grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if _channels_last(x) or _channels_last(weight):
        # cuDNN and oneDNN return a channels-last result for a channels-last input or weight
        # (torch's conv suggest-memory-format rule); promising it spares the wrapper a copy
        # (ensure_layout still copies where a library answers otherwise). Lowering runs this
        # again on the operands as realized (``layout_dependent=True`` on its define).
        return TensorMeta(shape, _channels_last_strides(shape), x.dtype, x.device, grad)
    return TensorMeta.contiguous(shape, x.dtype, x.device, grad)


def _channels_last_strides(shape):
    n, c, *spatial = shape
    inner = 1
    for s in spatial:
        inner *= s
    out = [inner * c, 1]
    step = c
    for s in reversed(spatial):
        out.insert(2, step)
        step *= s
    return tuple(out)


def _channels_last(t) -> bool:
    """torch's ``suggest_memory_format`` of a 4-d or 5-d tensor is channels-last: c10's stride
    test (meta/strides.py), which reads a sliced channels-last view as channels-last too and
    the ambiguous size-1 cases as contiguous."""
    return strides_like_channels_last(tuple(t.shape), tuple(t.stride))


def _conv_lowering(ctx, meta, x, weight, bias=None, *rest, **kwargs):
    """A library call; its input handed over channels-last where the graph's convolutions pay
    for it (inductor/conv_layout.py). On CUDA the bias is added by a kiln kernel instead:
    cuDNN adds it in a pass of its own over the result (torch's ``add_`` after the
    convolution), which the kernel reading the result can do for free."""
    if ctx.conv_channels_last and len(x.shape) == 4:
        x = _conv_layout.realize_channels_last(ctx, x)
        # the weight too: cuDNN converts an NCHW weight itself on every call (an ATen copy with
        # an allocation each: 17 of ResNet-50's 53 convolutions, the non-1x1 ones); a kiln
        # kernel makes the copy instead, as Inductor's layout optimization does. A 1x1 or
        # depthwise weight is channels-last already (its size-1 dims' strides do not count).
        if isinstance(weight, L.TValue) and len(weight.shape) == 4:
            weight = _conv_layout.realize_channels_last(ctx, weight)
    if isinstance(bias, L.TValue) and _conv_layout.splits_bias(meta.device) and \
            bias.dtype == meta.dtype and not _conv_layout.symbolic(meta):
        out = L.extern_rule(ctx, meta, x, weight, None, *rest, **kwargs)
        return _conv_layout.add_channel_bias(out, bias)
    return L.extern_rule(ctx, meta, x, weight, bias, *rest, **kwargs)


LOWERINGS[conv] = _conv_lowering


# ------------------------------------------------------------------ scatter and random
def _scatter_add_eager(x, dim, index, src):
    return torch.scatter_add(x, dim, index, src)


scatter_add = define("prims", "scatter_add", _scatter_add_eager)


@META_RULES.register(scatter_add)
def _scatter_add_meta(x, dim, index, src):
    _check_index("scatter_add", index)
    if src.dtype != x.dtype:
        raise NNPrimError(f"[meta] prims.scatter_add: src dtype {src.dtype} differs from {x.dtype}")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad or src.requires_grad)


LOWERINGS[scatter_add] = L.scatter_rule("scatter")

index_add = define("prims", "index_add", lambda x, dim, index, src: torch.index_add(x, dim, index, src))


@META_RULES.register(index_add)
def _index_add_meta(x, dim, index, src):
    _check_index("index_add", index)
    if src.dtype != x.dtype:
        raise NNPrimError(f"[meta] prims.index_add: src dtype {src.dtype} differs from {x.dtype}")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad or src.requires_grad)


LOWERINGS[index_add] = L.scatter_rule("index")


def _write_meta(name):
    def meta(x, dim, index, src):
        _check_index(name, index)
        if src.dtype != x.dtype:
            raise NNPrimError(f"[meta] prims.{name}: src dtype {src.dtype} differs from {x.dtype}")
        return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad or src.requires_grad)
    return meta


# The overwriting forms of the two above: a position named twice receives one of its values,
# as eager's scatter and index_copy give it (which one is unspecified), never their sum.
scatter_store = define("prims", "scatter_store",
                       lambda x, dim, index, src: torch.scatter(x, dim, index.long(), src))
META_RULES[scatter_store] = _write_meta("scatter_store")
LOWERINGS[scatter_store] = L.scatter_rule("scatter", "store")

index_copy = define("prims", "index_copy",
                    lambda x, dim, index, src: torch.index_copy(x, dim, index.long(), src))
META_RULES[index_copy] = _write_meta("index_copy")
LOWERINGS[index_copy] = L.scatter_rule("index", "store")


def _rand_eager(shape, dtype, device):
    return torch.rand(shape, dtype=dtype, device=device)


rand = define("prims", "rand", _rand_eager, random=True)


@META_RULES.register(rand)
def _rand_meta(shape, dtype, device):
    if not dtype.is_floating_point:
        raise NNPrimError(f"[meta] prims.rand: needs a floating dtype, got {dtype}")
    return TensorMeta.contiguous(tuple(shape), dtype, device)


LOWERINGS[rand] = L.rand_rule


def _full_eager(shape, value, dtype, device):
    return torch.full(tuple(shape), value, dtype=dtype, device=device)


full = define("prims", "full", _full_eager)
META_RULES[full] = lambda shape, value, dtype, device: TensorMeta.contiguous(tuple(shape), dtype, device)
LOWERINGS[full] = L.full_rule


def _prim_fallback_eager(target, *args, **kwargs):
    from kiln.ops.core_fallback import resolve
    return resolve(target)(*args, **kwargs)


# random=True: the callable may draw random numbers (torch.bernoulli, F.gumbel_softmax): two
# calls are never merged by CSE (ops/core_fallback.py)
fallback = define("prims", "fallback", _prim_fallback_eager, library=True, random=True)


@META_RULES.register(fallback)
def _prim_fallback_meta(target, *args, **kwargs):
    from kiln.ops.core_fallback import fallback_meta
    return fallback_meta(target, *args, **kwargs)


@LOWERINGS.register(fallback)
def _prim_fallback_lowering(ctx, meta, *args, **kwargs):
    """One wrapper call; several results (torch.sort) are one ``ir.ExternItem`` each."""
    if isinstance(meta, tuple):
        return L.extern_multi_rule(ctx, meta, *args, **kwargs)
    return L.extern_rule(ctx, meta, *args, **kwargs)
