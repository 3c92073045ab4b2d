"""Core neural-network ops: matmul family, normalizations, embedding, losses, attention and
convolution. Each has its eager implementation, meta rule and decomposition next to it.

GEMMs, attention and convolution decompose to library prims (kept whole for cuBLAS / flash
attention / cuDNN); normalizations and losses decompose to reductions and pointwise prims,
which the scheduler fuses (layer norm and cross-entropy become one reduction kernel each).
"""
from __future__ import annotations

import builtins
import math

import torch
import torch.nn.functional as F

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.core_reductions import _accum_dtype
from kiln.ops.core_views import normalize_dim
from kiln.ops.prim_utils import broadcast_to, to_dtype
from kiln.ops.promotion import broadcast_shapes
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define
from kiln.ops.registry import DECOMPOSITIONS as D
from kiln.ops.prims_nn import _channels_last, _channels_last_strides

__all__ = ["matmul", "bmm", "addmm", "baddbmm", "layer_norm", "rms_norm", "group_norm",
           "batch_norm", "embedding", "gather", "index_select", "cross_entropy", "nll_loss",
           "mse_loss", "l1_loss", "bce_with_logits", "sdpa", "sdpa_backward", "conv"]


class NNError(ValueError):
    pass


def _grad(*ts):
    return builtins.any(t is not None and t.requires_grad for t in ts)


def _reduce_loss(loss, reduction, denom=None):
    if reduction == "none":
        return loss
    total = prims.sum(loss, tuple(range(loss.ndim))) if loss.ndim else loss
    if reduction == "sum":
        return total
    if reduction == "mean":
        return prims.div(total, denom if denom is not None else float(max(loss.numel(), 1)) if loss.numel() else 0.0)
    raise NNError(f"unknown reduction {reduction!r}")


def _loss_shape(shape, reduction):
    return tuple(shape) if reduction == "none" else ()


# ------------------------------------------------------------------ matmul family
def _matmul_shape(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise NNError("[meta] core.matmul: both arguments need at least one dimension")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise NNError(f"[meta] core.matmul: cannot multiply {list(a.shape)} by {list(b.shape)}")
    if a.ndim == 1 and b.ndim == 1:
        return ()
    if b.ndim == 1:
        return tuple(a.shape[:-1])
    if a.ndim == 1:
        return tuple(b.shape[:-2]) + (b.shape[-1],)
    batch = broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    return batch + (a.shape[-2], b.shape[-1])


matmul = define("core", "matmul", torch.matmul, eager_layout="contiguous")


@META_RULES.register(matmul)
def _matmul_meta(a, b):
    if a.dtype != b.dtype:
        raise NNError(f"[meta] core.matmul: dtypes differ ({a.dtype} vs {b.dtype})")
    return TensorMeta.contiguous(_matmul_shape(a, b), a.dtype, a.device, _grad(a, b))


@DECOMPOSITIONS.register(matmul)
def _matmul_decomp(a, b):
    out_shape = _matmul_shape(a, b)
    if a.ndim == 1 and b.ndim == 1:
        return prims.sum(prims.mul(a, b), (0,))
    a2 = prims.reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = prims.reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    if b2.ndim == 2:  # fold every leading dim of a into the rows of one mm
        rows = prims.reshape(a2, (-1, a2.shape[-1])) if a2.ndim != 2 else a2
        return prims.reshape(prims.mm(rows, b2), out_shape)
    batch = broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2]))
    nb = math.prod(batch)
    a3 = prims.reshape(broadcast_to(a2, batch + tuple(a2.shape[-2:])), (nb,) + tuple(a2.shape[-2:]))
    b3 = prims.reshape(broadcast_to(b2, batch + tuple(b2.shape[-2:])), (nb,) + tuple(b2.shape[-2:]))
    return prims.reshape(prims.bmm(a3, b3), out_shape)


bmm = define("core", "bmm", torch.bmm, eager_layout="contiguous")
META_RULES[bmm] = lambda a, b: META_RULES[prims.bmm](a, b)
DECOMPOSITIONS[bmm] = lambda a, b: prims.bmm(a, b)


def _addmm_eager(bias, a, b, beta=1, alpha=1):
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha)


addmm = define("core", "addmm", _addmm_eager, eager_layout="contiguous")


@META_RULES.register(addmm)
def _addmm_meta(bias, a, b, beta=1, alpha=1):
    shape = (a.shape[0], b.shape[1])
    broadcast_shapes(tuple(bias.shape), shape)
    return TensorMeta.contiguous(shape, a.dtype, a.device, _grad(bias, a, b))


def _scaled(x, c):
    return x if c == 1 else prims.mul(x, float(c) if x.dtype.is_floating_point else c)


@DECOMPOSITIONS.register(addmm)
def _addmm_decomp(bias, a, b, beta=1, alpha=1):
    if beta == 1 and alpha == 1 and bias.ndim == 1 and bias.shape[0] == b.shape[1] \
            and bias.dtype == a.dtype == b.dtype:  # the bias in the GEMM's epilogue
        return prims.addmm(bias, a, b)
    prod = _scaled(prims.mm(a, b), alpha)
    if beta == 0:
        return prod
    return prims.add(prod, _scaled(broadcast_to(bias, prod.shape), beta))


def _baddbmm_eager(bias, a, b, beta=1, alpha=1):
    return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha)


baddbmm = define("core", "baddbmm", _baddbmm_eager, eager_layout="contiguous")


@META_RULES.register(baddbmm)
def _baddbmm_meta(bias, a, b, beta=1, alpha=1):
    shape = (a.shape[0], a.shape[1], b.shape[2])
    return TensorMeta.contiguous(shape, a.dtype, a.device, _grad(bias, a, b))


@DECOMPOSITIONS.register(baddbmm)
def _baddbmm_decomp(bias, a, b, beta=1, alpha=1):
    prod = _scaled(prims.bmm(a, b), alpha)
    if beta == 0:
        return prod
    return prims.add(prod, _scaled(broadcast_to(bias, prod.shape), beta))


# ------------------------------------------------------------------ normalizations
def _norm_dims(x, normalized_shape, op):
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if tuple(x.shape[x.ndim - k:]) != normalized_shape:
        raise NNError(f"[meta] core.{op}: normalized_shape {list(normalized_shape)} does not match "
                      f"the input's trailing dims {list(x.shape)}")
    return tuple(range(x.ndim - k, x.ndim))


def _layer_norm_eager(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


layer_norm = define("core", "layer_norm", _layer_norm_eager, eager_layout="follows")


@META_RULES.register(layer_norm)
def _layer_norm_meta(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    _norm_dims(x, normalized_shape, "layer_norm")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, _grad(x, weight, bias))


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = prims.mul(y, broadcast_to(to_dtype(weight, y.dtype), shape))
    if bias is not None:
        y = prims.add(y, broadcast_to(to_dtype(bias, y.dtype), shape))
    return y


def _normalize(xa, dims, eps, center=True):
    n = float(math.prod(xa.shape[d] for d in dims))
    keep = tuple(1 if d in dims else s for d, s in enumerate(xa.shape))
    if center:
        mean = prims.reshape(prims.div(prims.sum(xa, dims), n), keep)
        centered = prims.sub(xa, broadcast_to(mean, xa.shape))
    else:
        centered = xa
    var = prims.reshape(prims.div(prims.sum(prims.mul(centered, centered), dims), n), keep)
    rstd = prims.rsqrt(prims.add(var, float(eps)))
    return prims.mul(centered, broadcast_to(rstd, xa.shape))


@DECOMPOSITIONS.register(layer_norm)
def _layer_norm_decomp(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = _norm_dims(x, normalized_shape, "layer_norm")
    xa = to_dtype(x, _accum_dtype(x.dtype))
    y = _affine(_normalize(xa, dims, eps), weight, bias, xa.shape)
    return to_dtype(y, x.dtype)


def _rms_norm_eager(x, normalized_shape, weight=None, eps=None):
    return F.rms_norm(x, normalized_shape, weight, eps)


rms_norm = define("core", "rms_norm", _rms_norm_eager)


@META_RULES.register(rms_norm)
def _rms_norm_meta(x, normalized_shape, weight=None, eps=None):
    _norm_dims(x, normalized_shape, "rms_norm")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, _grad(x, weight))


@DECOMPOSITIONS.register(rms_norm)
def _rms_norm_decomp(x, normalized_shape, weight=None, eps=None):
    dims = _norm_dims(x, normalized_shape, "rms_norm")
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    xa = to_dtype(x, _accum_dtype(x.dtype))
    y = _affine(_normalize(xa, dims, eps, center=False), weight, None, xa.shape)
    return to_dtype(y, x.dtype)


def _group_norm_eager(x, num_groups, weight=None, bias=None, eps=1e-5):
    return F.group_norm(x, num_groups, weight, bias, eps)


group_norm = define("core", "group_norm", _group_norm_eager)


@META_RULES.register(group_norm)
def _group_norm_meta(x, num_groups, weight=None, bias=None, eps=1e-5):
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise NNError(f"[meta] core.group_norm: {x.shape[1] if x.ndim > 1 else '?'} channels do not "
                      f"split into {num_groups} groups")
    return _norm_result(x, weight, bias)


def _norm_result(x, weight, bias):
    """batch_norm's and group_norm's result: torch allocates it in the input's suggested memory
    format (``empty_like(x, x.suggest_memory_format())``), channels-last for a channels-last
    input, else contiguous."""
    if _channels_last(x):
        return TensorMeta(x.shape, _channels_last_strides(x.shape), x.dtype, x.device, _grad(x, weight, bias))
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, _grad(x, weight, bias))


@DECOMPOSITIONS.register(group_norm)
def _group_norm_decomp(x, num_groups, weight=None, bias=None, eps=1e-5):
    n, c = x.shape[0], x.shape[1]
    xa = to_dtype(x, _accum_dtype(x.dtype))
    grouped = prims.reshape(xa, (n, num_groups, -1))
    y = prims.reshape(_normalize(grouped, (2,), eps), tuple(x.shape))
    per_channel = (c,) + (1,) * (x.ndim - 2)
    w = prims.reshape(weight, per_channel) if weight is not None else None
    b = prims.reshape(bias, per_channel) if bias is not None else None
    return to_dtype(_affine(y, w, b, y.shape), x.dtype)


def _batch_norm_eager(x, running_mean, running_var, weight=None, bias=None, training=False,
                      momentum=0.1, eps=1e-5):
    return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)


batch_norm = define("core", "batch_norm", _batch_norm_eager)


@META_RULES.register(batch_norm)
def _batch_norm_meta(x, running_mean, running_var, weight=None, bias=None, training=False,
                     momentum=0.1, eps=1e-5):
    if training and running_mean is not None:
        raise NNError("[meta] core.batch_norm: training mode with running stats updates buffers "
                      "in place, which compiled graphs do not do yet")
    return _norm_result(x, weight, bias)


# fp32 CPU training batch norm with at most this many elements per channel computes in float64
FEW_PER_CHANNEL = 256


def batch_norm_dtype(x, training):
    """The dtype batch norm computes in. fp32 training on the CPU over few elements per channel
    (at most FEW_PER_CHANNEL, known statically): float64. There (a 1x1 feature map over a
    batch of 2) the input gradient is a difference of nearly equal terms,
    (g - mean(g)) - xhat * mean(g * xhat), whose fp32 rounding later layers amplify: kiln's
    gradients of MobileNet-v2 (transformers, tiny config) were 2-2.6x further from float64 than
    eager's (whose CPU kernel accumulates in double), in float64 below eager's. Over many
    elements per channel fp32 with the C++ reductions' cascaded sums is as accurate as eager,
    and float64 there cost 55% of a BN-ReLU-BN training step (docs/notes/session-38-bn.md)."""
    if training and x.dtype == torch.float32 and x.device.type == "cpu":
        per_channel = 1
        for d, n in enumerate(x.shape):
            if d != 1:
                per_channel *= n
        if type(per_channel) is int and per_channel <= FEW_PER_CHANNEL:
            return torch.float64
    return _accum_dtype(x.dtype)


@DECOMPOSITIONS.register(batch_norm)
def _batch_norm_decomp(x, running_mean, running_var, weight=None, bias=None, training=False,
                       momentum=0.1, eps=1e-5):
    c = x.shape[1]
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    xa = to_dtype(x, batch_norm_dtype(x, training))
    if training:  # batch statistics over every dim but the channels
        dims = tuple(d for d in range(x.ndim) if d != 1)
        y = _normalize(xa, dims, eps)
    else:
        mean = prims.reshape(to_dtype(running_mean, xa.dtype), per_channel)
        var = prims.reshape(to_dtype(running_var, xa.dtype), per_channel)
        rstd = prims.rsqrt(prims.add(var, float(eps)))
        y = prims.mul(prims.sub(xa, broadcast_to(mean, xa.shape)), broadcast_to(rstd, xa.shape))
    w = prims.reshape(weight, per_channel) if weight is not None else None
    b = prims.reshape(bias, per_channel) if bias is not None else None
    return to_dtype(_affine(y, w, b, xa.shape), x.dtype)


# ------------------------------------------------------------------ indexing with tensors
def _gather_eager(x, dim, index):
    return torch.gather(x, dim, index)


gather = define("core", "gather", _gather_eager)
META_RULES[gather] = lambda x, dim, index: META_RULES[prims.gather](x, normalize_dim(dim, x.ndim, "gather"), index)
DECOMPOSITIONS[gather] = lambda x, dim, index: prims.gather(x, normalize_dim(dim, x.ndim, "gather"), index)

index_select = define("core", "index_select", lambda x, dim, index: torch.index_select(x, dim, index))
META_RULES[index_select] = lambda x, dim, index: META_RULES[prims.index_select](
    x, normalize_dim(dim, x.ndim, "index_select"), index)
DECOMPOSITIONS[index_select] = lambda x, dim, index: prims.index_select(
    x, normalize_dim(dim, x.ndim, "index_select"), index)


def _embedding_eager(weight, indices):
    return F.embedding(indices, weight)


embedding = define("core", "embedding", _embedding_eager, eager_layout="contiguous")


@META_RULES.register(embedding)
def _embedding_meta(weight, indices):
    if weight.ndim != 2:
        raise NNError(f"[meta] core.embedding: weight must be 2-d, got {list(weight.shape)}")
    return TensorMeta.contiguous(tuple(indices.shape) + (weight.shape[1],), weight.dtype,
                                 weight.device, weight.requires_grad)


@DECOMPOSITIONS.register(embedding)
def _embedding_decomp(weight, indices):
    flat = prims.reshape(indices, (indices.numel(),)) if indices.ndim != 1 else indices
    rows = prims.index_select(weight, 0, flat)
    return prims.reshape(rows, tuple(indices.shape) + (weight.shape[1],))


# ------------------------------------------------------------------ losses
def _class_dim_last(x):
    """[N, C, d1, ...] -> [N*d1*..., C]; [C] -> [1, C]."""
    if x.ndim == 1:
        return prims.reshape(x, (1, x.shape[0]))
    if x.ndim == 2:
        return x
    perm = (0,) + tuple(range(2, x.ndim)) + (1,)
    return prims.reshape(prims.permute(x, perm), (-1, x.shape[1]))


def _nll_core(logp2, target, weight, ignore_index, reduction, label_smoothing, out_shape):
    """logp2: [M, C] log-probabilities; target: [M] class indices."""
    m, c = logp2.shape
    valid = prims.ne(target, ignore_index)
    safe = prims.where(valid, target, 0)
    picked = prims.reshape(prims.gather(logp2, 1, prims.reshape(safe, (m, 1))), (m,))
    if weight is not None:
        w_t = prims.index_select(to_dtype(weight, logp2.dtype), 0, safe)
        w_t = prims.where(valid, w_t, 0.0)
    else:
        w_t = to_dtype(valid, logp2.dtype)
    nll = prims.neg(prims.mul(picked, w_t))
    if label_smoothing:
        smooth = prims.neg(prims.sum(logp2, (1,)))
        smooth = prims.where(valid, smooth, 0.0)
        nll = prims.add(prims.mul(nll, 1.0 - label_smoothing), prims.mul(smooth, label_smoothing / c))
    if reduction == "none":
        return prims.reshape(nll, out_shape)
    denom = prims.sum(w_t, (0,)) if reduction == "mean" else None
    return _reduce_loss(nll, reduction, denom)


def _ce_eager(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(input, target, weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


cross_entropy = define("core", "cross_entropy", _ce_eager)


def _ce_meta(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    if target.dtype.is_floating_point:
        shape = (input.shape[0],) + tuple(input.shape[2:]) if input.ndim > 1 else ()
    else:
        shape = tuple(target.shape)
    if weight is not None and label_smoothing:
        raise NNError("[meta] core.cross_entropy: weight together with label_smoothing is not supported")
    return TensorMeta.contiguous(_loss_shape(shape, reduction), input.dtype, input.device, _grad(input))


META_RULES[cross_entropy] = _ce_meta


def _log_softmax_classes(x):
    from kiln.ops import core
    return D[core.log_softmax](x, 1 if x.ndim > 1 else 0)


@DECOMPOSITIONS.register(cross_entropy)
def _ce_decomp(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    logp = _log_softmax_classes(input)
    if target.dtype.is_floating_point:  # class probabilities
        t = target
        if label_smoothing:
            c = input.shape[1] if input.ndim > 1 else input.shape[0]
            t = prims.add(prims.mul(t, 1.0 - label_smoothing), label_smoothing / c)
        prod = prims.mul(logp, t)
        if weight is not None:
            shape = (1, weight.shape[0]) + (1,) * (input.ndim - 2) if input.ndim > 1 else (weight.shape[0],)
            prod = prims.mul(prod, broadcast_to(prims.reshape(weight, shape), prod.shape))
        loss = prims.neg(prims.sum(prod, (1 if input.ndim > 1 else 0,)))
        return _reduce_loss(loss, reduction, float(input.shape[0]) if input.ndim > 1 else None)
    out_shape = tuple(target.shape)
    tgt = prims.reshape(target, (target.numel(),)) if target.ndim != 1 else target
    return _nll_core(_class_dim_last(logp), tgt, weight, ignore_index, reduction, label_smoothing, out_shape)


def _nll_eager(input, target, weight=None, ignore_index=-100, reduction="mean"):
    return F.nll_loss(input, target, weight, ignore_index=ignore_index, reduction=reduction)


nll_loss = define("core", "nll_loss", _nll_eager)
META_RULES[nll_loss] = lambda input, target, weight=None, ignore_index=-100, reduction="mean": \
    TensorMeta.contiguous(_loss_shape(target.shape, reduction), input.dtype, input.device, _grad(input))


@DECOMPOSITIONS.register(nll_loss)
def _nll_decomp(input, target, weight=None, ignore_index=-100, reduction="mean"):
    tgt = prims.reshape(target, (target.numel(),)) if target.ndim != 1 else target
    return _nll_core(_class_dim_last(input), tgt, weight, ignore_index, reduction, 0.0, tuple(target.shape))


def _pointwise_loss(name, eager, body):
    op = define("core", name, eager)

    def meta(a, b, reduction="mean"):
        shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
        return TensorMeta.contiguous(_loss_shape(shape, reduction), a.dtype, a.device, _grad(a, b))

    def decomp(a, b, reduction="mean"):
        shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
        acc = _accum_dtype(a.dtype)
        loss = body(broadcast_to(to_dtype(a, acc), shape), broadcast_to(to_dtype(b, acc), shape))
        return to_dtype(_reduce_loss(loss, reduction), a.dtype)
    META_RULES[op] = meta
    DECOMPOSITIONS[op] = decomp
    return op


mse_loss = _pointwise_loss("mse_loss", lambda a, b, reduction="mean": F.mse_loss(a, b, reduction=reduction),
                           lambda a, b: prims.mul(prims.sub(a, b), prims.sub(a, b)))
l1_loss = _pointwise_loss("l1_loss", lambda a, b, reduction="mean": F.l1_loss(a, b, reduction=reduction),
                          lambda a, b: prims.abs(prims.sub(a, b)))


def _bce_body(x, y):
    # max(x, 0) - x * y + log(1 + exp(-|x|)): finite for any x
    return prims.add(prims.sub(prims.maximum(x, 0.0), prims.mul(x, y)),
                     prims.log(prims.add(prims.exp(prims.neg(prims.abs(x))), 1.0)))


bce_with_logits = _pointwise_loss(
    "bce_with_logits",
    lambda a, b, reduction="mean": F.binary_cross_entropy_with_logits(a, b, reduction=reduction),
    _bce_body)


# ------------------------------------------------------------------ attention, convolution
def _sdpa_eager(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)


sdpa = define("core", "sdpa", _sdpa_eager)
META_RULES[sdpa] = lambda q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None: \
    META_RULES[prims.sdpa](q, k, v, attn_mask, dropout_p, is_causal, scale)
DECOMPOSITIONS[sdpa] = lambda q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None: \
    prims.sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale)


# a backward op itself: a second derivative raises (no double backward through compiled graphs)
sdpa_backward = define("core", "sdpa_backward", prims.sdpa_backward.eager, differentiable=False)
META_RULES[sdpa_backward] = lambda g, q, k, v, attn_mask=None, is_causal=False, scale=None: \
    META_RULES[prims.sdpa_backward](g, q, k, v, attn_mask, is_causal, scale)
DECOMPOSITIONS[sdpa_backward] = lambda g, q, k, v, attn_mask=None, is_causal=False, scale=None: \
    prims.sdpa_backward(g, q, k, v, attn_mask, is_causal, scale)


def _conv_eager(x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    return prims.conv.eager(x, weight, bias, stride, padding, dilation, groups)


conv = define("core", "conv", _conv_eager)
META_RULES[conv] = lambda x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1: \
    META_RULES[prims.conv](x, weight, bias, stride, padding, dilation, groups)
DECOMPOSITIONS[conv] = lambda x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1: \
    prims.conv(x, weight, bias, stride, padding, dilation, groups)
