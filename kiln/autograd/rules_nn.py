"""VJP rules for the NN core ops of ``core_nn.py``: the matmul family, normalizations,
embedding and tensor indexing, losses, attention and convolution.

- Normalizations recompute their statistics from the input (reductions: the partitioner
  computes them in the forward and saves them, small) and use the usual closed forms.
- Embedding / index_select / gather scatter their gradient into zeros (``index_add`` /
  ``scatter_add``).
- Losses build one-hot masks from ``core.iota`` comparisons, which fuse into pointwise kernels.
- Attention recomputes the probabilities from q and k *in the backward* (``in_backward``), as
  flash attention does, so the forward saves q, k, v and not the [L, S] probabilities.
- Convolution's gradients are one library call (``kiln/ops/conv.py``: cuDNN, oneDNN), as in
  eager autograd; ``config.conv_library_backward=False`` writes them as convolutions themselves
  (transposed for the input, with batch and channels swapped for the weight), much slower.
"""
from __future__ import annotations

import math

import torch

from kiln.config import config
from kiln.ops import attention, conv, core
from kiln.ops.core_nn import batch_norm_dtype
from kiln.ops.core_views import normalize_dim
from kiln.ops.core_einsum import letter_sizes, parse_einsum
from kiln.ops.registry import TRAINING_FORMS, VJP_RULES
from kiln.autograd.rules import (_one_minus, in_backward, is_tensor, restore_reduced,
                                 sum_to_shape, zeros_like)

# ------------------------------------------------------------------ matmul family


def _mT(x):
    return core.transpose(x, -2, -1)


@VJP_RULES.register(core.matmul)
def matmul_vjp(g, out, a, b):
    if a.ndim == 1 and b.ndim == 1:
        return core.mul(g, b), core.mul(g, a)
    a2 = core.unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = core.unsqueeze(b, 1) if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = core.unsqueeze(g2, -2)
    if b.ndim == 1:
        g2 = core.unsqueeze(g2, -1)
    ga = gb = None
    if is_tensor(a):
        ga = core.matmul(g2, _mT(b2)) if b2.ndim > 2 or g2.ndim > 2 else core.mm(g2, _mT(b2))
        ga = sum_to_shape(ga, tuple(a2.shape))
        ga = core.reshape(ga, tuple(a.shape)) if a.ndim == 1 else ga
    if is_tensor(b):
        if b2.ndim == 2:  # fold a's batch dims into one mm: no [batch, k, n] intermediate
            k, m = a2.shape[-1], g2.shape[-1]
            a_rows = core.reshape(a2, (-1, k)) if a2.ndim != 2 else a2
            g_rows = core.reshape(g2, (-1, m)) if g2.ndim != 2 else g2
            gb = core.mm(core.transpose(a_rows, 0, 1), g_rows)
        else:
            gb = sum_to_shape(core.matmul(_mT(a2), g2), tuple(b2.shape))
        gb = core.reshape(gb, tuple(b.shape)) if b.ndim == 1 else gb
    return ga, gb


@VJP_RULES.register(core.bmm)
def bmm_vjp(g, out, a, b):
    return core.bmm(g, _mT(b)), core.bmm(_mT(a), g)


def _times(x, c):
    return x if c == 1 else core.mul(x, c)


def _bias_grad(g, beta):
    return zeros_like(g) if beta == 0 else _times(g, beta)


@VJP_RULES.register(core.addmm)
def addmm_vjp(g, out, bias, a, b, beta=1, alpha=1):
    return (_bias_grad(g, beta) if is_tensor(bias) else None,
            _times(core.mm(g, core.transpose(b, 0, 1)), alpha),
            _times(core.mm(core.transpose(a, 0, 1), g), alpha), None, None)


@VJP_RULES.register(core.baddbmm)
def baddbmm_vjp(g, out, bias, a, b, beta=1, alpha=1):
    return (_bias_grad(g, beta) if is_tensor(bias) else None,
            _times(core.bmm(g, _mT(b)), alpha), _times(core.bmm(_mT(a), g), alpha), None, None)


# ------------------------------------------------------------------ normalizations
def _acc(x):
    return core.to_dtype(x, torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x


def _normalized(x, dims, eps, center=True):
    """(xhat, rstd) over dims, statistics with keepdim."""
    if center:
        mean = core.mean(x, dims, True)
        xc = core.sub(x, mean)
        var = core.var(x, dims, 0, True)
    else:
        xc = x
        var = core.mean(core.mul(x, x), dims, True)
    rstd = core.rsqrt(core.add(var, float(eps)))
    return core.mul(xc, rstd), rstd


def _norm_input_grad(gxhat, xhat, rstd, dims, center=True):
    """Gradient through xhat = (x - mean) * rstd (or x * rstd without centering)."""
    proj = core.mul(xhat, core.mean(core.mul(gxhat, xhat), dims, True))
    inner = core.sub(gxhat, proj)
    if center:
        inner = core.sub(inner, core.mean(gxhat, dims, True))
    return core.mul(inner, rstd)


@VJP_RULES.register(core.layer_norm)
def layer_norm_vjp(g, out, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = tuple(range(x.ndim - len(tuple(normalized_shape)), x.ndim))
    xa, ga = _acc(x), _acc(g)
    xhat, rstd = _normalized(xa, dims, eps)
    gxhat = core.mul(ga, weight) if is_tensor(weight) else ga
    gx = _norm_input_grad(gxhat, xhat, rstd, dims) if is_tensor(x) else None
    gw = core.mul(ga, xhat) if is_tensor(weight) else None   # summed to weight's shape by the builder
    gb = ga if is_tensor(bias) else None
    return gx, None, gw, gb, None


@VJP_RULES.register(core.rms_norm)
def rms_norm_vjp(g, out, x, normalized_shape, weight=None, eps=None):
    dims = tuple(range(x.ndim - len(tuple(normalized_shape)), x.ndim))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    xa, ga = _acc(x), _acc(g)
    xhat, rstd = _normalized(xa, dims, eps, center=False)
    gxhat = core.mul(ga, weight) if is_tensor(weight) else ga
    gx = _norm_input_grad(gxhat, xhat, rstd, dims, center=False)
    gw = core.mul(ga, xhat) if is_tensor(weight) else None
    return gx, None, gw, None


def _per_channel(v, x):
    return core.reshape(v, (1, x.shape[1]) + (1,) * (x.ndim - 2))


def _channel_sum(v):
    """[N, C, ...] summed to [C]."""
    return core.sum(v, tuple(d for d in range(v.ndim) if d != 1), False)


@VJP_RULES.register(core.group_norm)
def group_norm_vjp(g, out, x, num_groups, weight=None, bias=None, eps=1e-5):
    n = x.shape[0]
    xa, ga = _acc(x), _acc(g)
    grouped = core.reshape(xa, (n, num_groups, -1))
    xhat_g, rstd = _normalized(grouped, (2,), eps)
    xhat = core.reshape(xhat_g, tuple(x.shape))
    gxhat = core.mul(ga, _per_channel(weight, x)) if is_tensor(weight) else ga
    gx = _norm_input_grad(core.reshape(gxhat, (n, num_groups, -1)), xhat_g, rstd, (2,))
    gx = core.reshape(gx, tuple(x.shape))
    gw = _channel_sum(core.mul(ga, xhat)) if is_tensor(weight) else None
    gb = _channel_sum(ga) if is_tensor(bias) else None
    return gx, None, gw, gb, None


@VJP_RULES.register(core.batch_norm)
def batch_norm_vjp(g, out, x, running_mean, running_var, weight=None, bias=None, training=False,
                   momentum=0.1, eps=1e-5):
    # in the forward's dtype (core_nn.batch_norm_dtype: float64 for fp32 training on the CPU),
    # each gradient cast back to its input's dtype
    acc = batch_norm_dtype(x, training)
    xa, ga = _cast(x, acc), _cast(g, acc)
    gxhat = core.mul(ga, _per_channel(weight, x)) if is_tensor(weight) else ga
    # the statistics come from the forward (reductions, saved: a few floats per channel); the
    # normalized activations are computed here from the input (a convolution wrote it: saving
    # it costs no write), so the forward does not write a second, same-sized tensor for them
    if training:
        dims = tuple(d for d in range(x.ndim) if d != 1)
        mean = core.mean(xa, dims, True)
        rstd = core.rsqrt(core.add(core.var(xa, dims, 0, True), float(eps)))
        with in_backward(g):
            xhat = core.mul(core.sub(xa, mean), rstd)
        gx = _norm_input_grad(gxhat, xhat, rstd, dims)
    else:
        rstd = core.rsqrt(core.add(_per_channel(running_var, x), float(eps)))
        with in_backward(g):
            xhat = core.mul(core.sub(xa, _per_channel(running_mean, x)), rstd)
        gx = core.mul(gxhat, rstd)
    gw = _to(_channel_sum(core.mul(ga, xhat)), weight) if is_tensor(weight) else None
    gb = _to(_channel_sum(ga), bias) if is_tensor(bias) else None
    return _to(gx, x), None, None, gw, gb, None, None, None


def _cast(v, dtype):
    return v if v.dtype == dtype else core.to_dtype(v, dtype)


def _to(v, like):
    return _cast(v, like.dtype)


# ------------------------------------------------------------------ indexing with tensors
@VJP_RULES.register(core.embedding)
def embedding_vjp(g, out, weight, indices):
    d = weight.shape[1]
    rows = core.reshape(g, (-1, d)) if g.ndim != 2 else g
    flat = core.reshape(indices, (-1,)) if indices.ndim != 1 else indices
    return core.index_add(zeros_like(weight), 0, flat, rows), None


@VJP_RULES.register(core.index_select)
def index_select_vjp(g, out, x, dim, index):
    return core.index_add(zeros_like(x), dim, index, g), None, None


@VJP_RULES.register(core.gather)
def gather_vjp(g, out, x, dim, index):
    return core.scatter_add(zeros_like(x), dim, index, g), None, None


# ------------------------------------------------------------------ losses
def _loss_scale(g, reduction, loss_shape, denom=None):
    """The gradient of each element of the unreduced loss."""
    if reduction == "none":
        return g
    if reduction == "sum":
        return g
    return core.div(g, denom) if denom is not None else core.div(g, float(max(math.prod(loss_shape), 1)))


def _class_dim(x):
    return 1 if x.ndim > 1 else 0


def _one_hot(g, target, x):
    """[N, C, d...] bool: target's class along x's class dim (g anchors the iota)."""
    cd = _class_dim(x)
    c = x.shape[cd]
    classes = core.iota(g, c, target.dtype)
    classes = core.reshape(classes, (c,) + (1,) * (x.ndim - 1 - cd)) if x.ndim > 1 else classes
    return core.eq(core.unsqueeze(target, cd) if x.ndim > 1 else target, classes)


def _nll_grad(g, x, target, weight, ignore_index, reduction, label_smoothing, row_sum=False):
    """d loss / d log-probabilities for class-index targets (the decomposition's formula); with
    ``row_sum``, also its sum over the classes (keepdim), which without label smoothing is the
    one picked value: a sum over the classes would be a whole pass of the backward kernel
    (8192 x 50304 compares per GPT-2 step) to find it."""
    cd = _class_dim(x)
    c = x.shape[cd]
    valid = core.ne(target, ignore_index)
    onehot = _one_hot(g, target, x)
    if is_tensor(weight):
        w_b = core.reshape(weight, (c,) + (1,) * (x.ndim - 1 - cd)) if x.ndim > 1 else weight
        w_t = core.sum(core.where(onehot, core.to_dtype(w_b, x.dtype), 0.0), (cd,), False)
        w_t = core.where(valid, w_t, 0.0)
    else:
        w_t = core.to_dtype(valid, x.dtype)
    denom = core.sum(w_t) if reduction == "mean" else None
    coef = _loss_scale(g, reduction, tuple(target.shape), denom)
    coef = core.expand(coef, tuple(target.shape)) if reduction != "none" else coef
    picked = core.mul(coef, w_t)
    if label_smoothing:
        picked = core.mul(picked, 1.0 - label_smoothing)
    picked = core.unsqueeze(picked, cd) if x.ndim > 1 else picked
    dlogp = core.where(onehot, core.neg(picked), 0.0)
    if label_smoothing:
        smooth = core.where(valid, core.mul(coef, label_smoothing / c), 0.0)
        smooth = core.unsqueeze(smooth, cd) if x.ndim > 1 else smooth
        dlogp = core.sub(dlogp, smooth)
    if row_sum:
        return dlogp, (None if label_smoothing else core.neg(picked))
    return dlogp


def _through_log_softmax(dlogp, input, cd, dsum=None):
    """``dlogp - softmax(input) * sum(dlogp)``, the softmax recomputed from the logits and their
    per-row max and sum of exponentials (float32). The backward then keeps the logits (alive
    anyway: a matmul wrote them) and two floats per row, instead of a full-size tensor the
    forward would have to write (824 MB per GPT-2 step at vocab 50304); the arithmetic runs in
    float32 and rounds once to the input's dtype."""
    x = input if input.dtype in (torch.float32, torch.float64) else core.to_dtype(input, torch.float32)
    # the forward's log_softmax computes the same max and sum (the prims graph's CSE merges
    # them: one pass over the logits, one exp per element)
    row_max = core.amax(x, (cd,), True)
    log_s = core.log(core.sum(core.exp(core.sub(x, row_max)), (cd,), True))
    if dsum is None:
        dsum = core.sum(dlogp, (cd,), True)
    with in_backward(dlogp):
        # the softmax from the logits here, so the forward has none to save: saving it (as big
        # as float32 logits) would add a full-size write to the forward, where the logits a
        # matmul wrote and two floats per row cost no write at all
        p = core.exp(core.sub(core.sub(x, row_max), log_s))
    gx = core.sub(dlogp, core.mul(p, dsum))
    return core.to_dtype(gx, input.dtype) if gx.dtype != input.dtype else gx


@VJP_RULES.register(core.cross_entropy)
def cross_entropy_vjp(g, out, input, target, weight=None, ignore_index=-100, reduction="mean",
                      label_smoothing=0.0):
    cd = _class_dim(input)
    c = input.shape[cd]
    if target.dtype.is_floating_point:  # class probabilities
        t = target
        if label_smoothing:
            t = core.add(core.mul(t, 1.0 - label_smoothing), label_smoothing / c)
        n = float(input.shape[0]) if input.ndim > 1 else None
        coef = _loss_scale(g, reduction, (), n)
        coef = core.unsqueeze(coef, cd) if reduction == "none" and input.ndim > 1 else coef
        wt = t
        if is_tensor(weight):
            w_b = core.reshape(weight, (c,) + (1,) * (input.ndim - 2)) if input.ndim > 1 else weight
            wt = core.mul(wt, w_b)
        dlogp = core.neg(core.mul(wt, coef))
        gx = _through_log_softmax(dlogp, input, cd)
        gt = None
        if is_tensor(target) and target.meta.requires_grad:
            logp = core.log_softmax(input, cd)
            local = core.mul(logp, w_b) if is_tensor(weight) else logp
            gt = core.neg(core.mul(local, coef))
            if label_smoothing:
                gt = core.mul(gt, 1.0 - label_smoothing)
        return gx, gt, None, None, None, None
    dlogp, dsum = _nll_grad(g, input, target, weight, ignore_index, reduction, label_smoothing, row_sum=True)
    return _through_log_softmax(dlogp, input, cd, dsum), None, None, None, None, None


@VJP_RULES.register(core.nll_loss)
def nll_loss_vjp(g, out, input, target, weight=None, ignore_index=-100, reduction="mean"):
    return _nll_grad(g, input, target, weight, ignore_index, reduction, 0.0), None, None, None, None


def _pointwise_loss_rule(local_grads):
    def rule(g, out, a, b, reduction="mean"):
        shape = torch.broadcast_shapes(tuple(a.shape), tuple(b.shape))
        coef = _loss_scale(g, reduction, shape)
        da, db = local_grads(_acc(a), _acc(b), coef)
        return (da if is_tensor(a) else None), (db if is_tensor(b) else None), None
    return rule


VJP_RULES[core.mse_loss] = _pointwise_loss_rule(
    lambda a, b, c: (lambda d: (d, core.neg(d)))(core.mul(core.mul(core.sub(a, b), 2.0), c)))
VJP_RULES[core.l1_loss] = _pointwise_loss_rule(
    lambda a, b, c: (lambda d: (d, core.neg(d)))(core.mul(core.sign(core.sub(a, b)), c)))
VJP_RULES[core.bce_with_logits] = _pointwise_loss_rule(
    lambda x, y, c: (core.mul(core.sub(core.sigmoid(x), y), c), core.mul(core.neg(x), c)))


# ------------------------------------------------------------------ attention
@TRAINING_FORMS.register(core.sdpa)
def sdpa_for_training(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """Attention that needs gradients runs torch's fused kernel, which returns the row
    log-sum-exps its backward needs (``ops/attention.py``): the backward never recomputes the
    forward. None (keep ``core.sdpa``) when no fused kernel fits or the mask needs a gradient."""
    if dropout_p or not config.fused_attention_backward:
        return None
    if attn_mask is not None and (not is_tensor(attn_mask) or attn_mask.meta.requires_grad):
        return None
    metas = [t.meta if is_tensor(t) else t for t in (q, k, v, attn_mask)]
    backend = attention.choose_backend(*metas, is_causal, scale)
    if backend is None:
        return None
    return attention.sdpa_fused(q, k, v, attn_mask, is_causal, scale, backend)[0]


@VJP_RULES.register(attention.sdpa_fused)
def sdpa_fused_vjp(g, out, q, k, v, attn_mask, is_causal, scale, backend):
    g_out = g[0]
    if g_out is None:  # only the saved state was used: it carries no gradient
        return None, None, None, None, None, None, None
    o, lse, seed, offset = out
    gq, gk, gv = attention.sdpa_fused_backward(g_out, q, k, v, o, lse, seed, offset, attn_mask,
                                               is_causal, scale, backend)
    return gq, gk, gv, None, None, None, None


@VJP_RULES.register(core.sdpa)
def sdpa_vjp(g, out, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if dropout_p:
        raise NotImplementedError("[vjp] core.sdpa with dropout_p > 0 has no VJP rule (its mask "
                                  "is not an output)")
    fused_mask = attn_mask is None or (is_tensor(attn_mask) and attn_mask.dtype == torch.bool)
    if config.fused_attention_backward and fused_mask and \
            tuple(g.shape) == tuple(q.shape) == tuple(k.shape) == tuple(v.shape):
        with in_backward(g):  # torch's fused backward on a recomputed forward: one library call
            packed = core.sdpa_backward(g, q, k, v, attn_mask, is_causal, scale)
            gq, gk, gv = (core.select(packed, 0, i) for i in range(3))
        return gq, gk, gv, None, None, None, None
    return _sdpa_recomputed_vjp(g, q, k, v, attn_mask, is_causal, scale)


def _sdpa_recomputed_vjp(g, q, k, v, attn_mask, is_causal, scale):
    """The decomposed attention backward. fp16/bf16 run in fp32 and round once: torch's fused
    and math kernels accumulate in fp32, and per-op rounding of the recomputed probabilities
    and of ``ds`` (which is also a float mask's gradient, summed over the dims the mask
    broadcasts along) drifted 2-3x further from the fp32 reference than eager."""
    low = q.dtype in (torch.float16, torch.bfloat16)
    up = (lambda t: core.to_dtype(t, torch.float32) if is_tensor(t) and t.dtype != torch.float32
          and t.dtype.is_floating_point else t) if low else (lambda t: t)
    back = (lambda t, like: core.to_dtype(t, like.dtype) if t.dtype != like.dtype else t)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    with in_backward(g):  # recompute the probabilities here, as flash attention does
        q32, k32, v32, g32, m32 = (up(t) for t in (q, k, v, g, attn_mask))
        s = core.mul(core.matmul(q32, _mT(k32)), float(scale))
        n_q, n_k = q.shape[-2], k.shape[-2]
        if is_causal:
            rows = core.reshape(core.iota(g, n_q), (n_q, 1))
            cols = core.reshape(core.iota(g, n_k), (1, n_k))
            s = core.where(core.le(cols, rows), s, -math.inf)
        if is_tensor(attn_mask):
            if attn_mask.dtype == torch.bool:
                s = core.where(attn_mask, s, -math.inf)
            else:
                s = core.add(s, m32)
        p = core.softmax(s, -1)
        gv = core.matmul(_mT(p), g32)
        dp = core.matmul(g32, _mT(v32))
        ds = core.mul(p, core.sub(dp, core.sum(core.mul(dp, p), (-1,), True)))
        gq = core.mul(core.matmul(ds, k32), float(scale))
        gk = core.mul(core.matmul(_mT(ds), q32), float(scale))
        gq, gk, gv = back(gq, q), back(gk, k), back(gv, v)
    gmask = None
    if is_tensor(attn_mask) and attn_mask.dtype.is_floating_point:
        with in_backward(g):  # summed over the broadcast dims in fp32, then rounded once
            gmask = back(sum_to_shape(ds, tuple(attn_mask.shape)), attn_mask)
    return gq, gk, gv, gmask, None, None, None


# ------------------------------------------------------------------ convolution
def _spread_zeros(g, d, step):
    """Insert step-1 zeros between neighbours along d: n -> (n-1) * step + 1."""
    if step == 1:
        return g
    from kiln.autograd.rules_shape import _spread, _pad_dim
    n = g.shape[d]
    g = _spread(g, d, step)
    return _pad_dim(g, g.ndim, d, 0, -(step - 1))


@VJP_RULES.register(core.conv)
def conv_vjp(g, out, x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    # only the gradients something needs: one call makes them all, so no later pass can drop one
    mask = tuple(is_tensor(t) and bool(t.meta.requires_grad) for t in (x, weight, bias))
    if config.conv_library_backward and any(mask):
        grads = iter(conv.conv_backward(g, x, weight, tuple(stride), tuple(padding), tuple(dilation),
                                        groups, mask))
        gx, gw, gb = (next(grads) if wanted else None for wanted in mask)
        return gx, gw, gb, None, None, None, None
    nd = x.ndim - 2
    spatial = tuple(range(2, x.ndim))
    n, c_in = x.shape[0], x.shape[1]
    c_out, c_in_g = weight.shape[0], weight.shape[1]
    ksize = tuple(weight.shape[2:])
    gx = gw = gb = None
    if is_tensor(x):
        # a transposed convolution: spread g by the stride, pad, correlate with the flipped,
        # in/out-swapped weight
        gd = g
        pad = []
        for i, d in enumerate(spatial):
            gd = _spread_zeros(gd, d, stride[i])
            lo = dilation[i] * (ksize[i] - 1) - padding[i]
            hi = x.shape[d] - gd.shape[d] - lo + dilation[i] * (ksize[i] - 1)
            pad = [lo, hi] + pad   # constant_pad pairs start at the last dim
        gd = core.constant_pad(gd, tuple(pad), 0.0)
        w = core.reshape(weight, (groups, c_out // groups, c_in_g) + ksize)
        w = core.transpose(w, 1, 2)
        w = core.reshape(w, (c_in, c_out // groups) + ksize)
        w = core.flip(w, spatial)
        gx = core.conv(gd, w, None, (1,) * nd, (0,) * nd, tuple(dilation), groups)
    if is_tensor(weight):
        # correlate x (channels as batch, batch as channels) with g: stride and dilation swap
        xs = core.reshape(x, (n, groups, c_in_g) + tuple(x.shape[2:]))
        xs = core.permute(xs, (2, 1, 0) + tuple(range(3, 3 + nd)))
        xs = core.reshape(xs, (c_in_g, groups * n) + tuple(x.shape[2:]))
        gs = core.reshape(g, (n, groups, c_out // groups) + tuple(g.shape[2:]))
        gs = core.permute(gs, (1, 2, 0) + tuple(range(3, 3 + nd)))
        gs = core.reshape(gs, (c_out, n) + tuple(g.shape[2:]))
        gw = core.conv(xs, gs, None, tuple(dilation), tuple(padding), tuple(stride), groups)
        for i, d in enumerate(spatial):
            if gw.shape[d] != ksize[i]:
                gw = core.slice(gw, d, 0, ksize[i], 1)
        gw = core.transpose(gw, 0, 1)
    if is_tensor(bias):
        gb = _channel_sum(g)
    return gx, gw, gb, None, None, None, None


@VJP_RULES.register(core.einsum)
def einsum_vjp(g, out, equation, *operands):
    """Each operand's gradient is an einsum of g with the other operands into its subscripts;
    its size-1 (broadcast) dims are summed back and letters only it had are expanded back."""
    subs, o = parse_einsum(equation, [x.ndim for x in operands])
    sizes = letter_sizes(subs, [x.shape for x in operands], equation)
    grads = [None]
    for i, (x, s) in enumerate(zip(operands, subs)):
        others = [(y, t) for j, (y, t) in enumerate(zip(operands, subs)) if j != i]
        have = "".join(c for c in s if c in set(o).union(*(set(t) for _, t in others)))
        gx = core.einsum(",".join([o] + [t for _, t in others]) + "->" + have, g, *[y for y, _ in others])
        dims = [k for k, c in enumerate(have) if x.shape[s.index(c)] == 1 and sizes[c] != 1]
        if dims:
            gx = core.sum(gx, dims, True)
        if have != s:
            for k, c in enumerate(s):
                if c not in have:
                    gx = core.unsqueeze(gx, k)
            gx = core.expand(gx, tuple(x.shape))
        grads.append(gx)
    return tuple(grads)
