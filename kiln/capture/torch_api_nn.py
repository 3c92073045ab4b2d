"""Capture-table entries for the neural-network ops (merged into torch_api's tables)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.capture.errors import Unsupported
from kiln.ops import core
from kiln.capture.torch_api_inplace import Writes
from kiln.meta.defaults import default_device, default_dtype


def _pair(v, n):
    """An int, or a list of one (torch expands both: ``Conv2d(stride=[1])``), or of n."""
    if isinstance(v, (tuple, list)):
        return tuple(v) * n if len(v) == 1 else tuple(v)
    return (v,) * n


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return core.layer_norm(input, tuple(normalized_shape) if not isinstance(normalized_shape, int)
                           else (normalized_shape,), weight, bias, eps)


def _torch_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    # torch.layer_norm, as F.layer_norm calls it: cudnn_enable picks a kernel, not a result
    return layer_norm(input, normalized_shape, weight, bias, eps)


def _torch_group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    return group_norm(input, num_groups, weight, bias, eps)


def _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                      cudnn_enabled=True):
    # torch.batch_norm takes the affine parameters before the running statistics
    return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    return core.rms_norm(input, tuple(normalized_shape) if not isinstance(normalized_shape, int)
                         else (normalized_shape,), weight, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    return core.group_norm(input, num_groups, weight, bias, eps)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    if training and running_mean is not None:
        raise Unsupported("batch_norm in training mode updates running stats in place "
                          "(buffer mutation is not captured yet)")
    return core.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise Unsupported("F.embedding(max_norm=...) renormalizes the weight in place")
    if scale_grad_by_freq and weight.meta.requires_grad:
        raise Unsupported("F.embedding(scale_grad_by_freq=True) with a gradient is not captured")
    out = core.embedding(weight, input)
    if padding_idx is None or not weight.meta.requires_grad:
        return out
    # eager's backward leaves the padding row's gradient zero: the positions holding that id
    # take the same values through a detached copy, so no gradient reaches the row from them
    if padding_idx < 0:
        padding_idx += weight.shape[0]
    is_padding = core.unsqueeze(core.eq(input, padding_idx), -1)
    return core.where(is_padding, core.detach(out), out)


def _reduction(size_average, reduce, reduction):
    if size_average is not None or reduce is not None:
        raise Unsupported("the deprecated size_average/reduce loss arguments are not supported")
    return reduction


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    reduction = _reduction(size_average, reduce, reduction)
    if weight is not None and label_smoothing:
        raise Unsupported("cross_entropy with both weight and label_smoothing is not supported")
    return core.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    return core.nll_loss(input, target, weight, ignore_index, _reduction(size_average, reduce, reduction))


def _simple_loss(op):
    def adapter(input, target, size_average=None, reduce=None, reduction="mean", **kw):
        if kw.get("weight") is not None or kw.get("pos_weight") is not None:
            raise Unsupported(f"{op.name} with weight/pos_weight is not supported")
        return op(input, target, _reduction(size_average, reduce, reduction))
    return adapter


def dropout(input, p=0.5, training=True, inplace=False):
    if not 0 <= p <= 1:
        raise Unsupported(f"dropout probability {p} is not in [0, 1]")
    if not training or p == 0:
        return input
    if inplace:
        raise Unsupported("dropout(inplace=True) in training mode mutates its input")
    floating = input.dtype.is_floating_point or input.dtype.is_complex
    if p == 1:  # zeros of the input's dtype
        return core.mul(input, 0.0) if floating else core.full(tuple(input.shape), 0, input.dtype, input.device)
    if not floating:  # eager scales by 1/(1-p) in place: a float cannot be cast back
        raise RuntimeError(f"[meta] dropout: result type Float can't be cast to the desired output "
                           f"type {input.dtype}")
    # In core ops, so autograd sees the mask: a random op is never recomputed, so the backward
    # uses the very mask the forward drew.
    keep = core.ge(core.rand(tuple(input.shape), torch.float32, input.device), float(p))
    return core.where(keep, core.mul(input, 1.0 / (1.0 - p)), 0.0)


def _size_args(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        return tuple(size[0])
    return tuple(size)


def rand(*size, generator=None, dtype=None, device=None, layout=None, requires_grad=False,
         pin_memory=False, out=None):
    if generator is not None or out is not None or requires_grad:
        raise Unsupported("torch.rand with generator/out/requires_grad is not supported")
    return core.rand(_size_args(size), dtype or default_dtype(),
                     torch.device(device) if device is not None else default_device())


def rand_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    from kiln.capture.torch_api_creation import make_like
    dtype = dtype or input.dtype
    device = torch.device(device) if device is not None else input.device
    return make_like(input, lambda shape: core.rand(shape, dtype, device), memory_format)


# In-place draws that fill a tensor (PhiMoE's router in training: ``empty_like(g).exponential_()``,
# ``empty_like(h).uniform_(1 - eps, 1 + eps)``): fresh random values of self's shape and dtype,
# written into self. A core random op is never recomputed, so a backward sees the same values.
def _draw_into(self, generator, name):
    if generator is not None:
        raise Unsupported(f"Tensor.{name}(generator=...) is not captured")
    if not self.dtype.is_floating_point:  # eager has no integer kernel for these
        raise RuntimeError(f"[meta] Tensor.{name}: not implemented for {self.dtype}")
    return core.rand(tuple(self.shape), self.dtype, self.device)


def uniform_(self, a=0.0, b=1.0, *, generator=None, **kw):
    a, b = kw.pop("from", a), kw.pop("to", b)  # torch's own keyword names
    if kw:
        raise TypeError(f"uniform_() got unexpected keyword arguments {sorted(kw)}")
    u = _draw_into(self, generator, "uniform_")
    return Writes([(self, core.add(core.mul(u, float(b - a)), float(a)))], self)


def exponential_(self, lambd=1.0, *, generator=None):
    u = _draw_into(self, generator, "exponential_")  # inverse CDF: -log(1 - u) / lambda
    return Writes([(self, core.mul(core.log1p(core.neg(u)), -1.0 / float(lambd)))], self)


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    _draw_into(self, generator, "normal_")
    z = core.randn(tuple(self.shape), self.dtype, self.device)
    return Writes([(self, core.add(core.mul(z, float(std)), float(mean)))], self)


def scatter_add(input, dim, index, src):
    return core.scatter_add(input, dim, index, src)


def index_add(input, dim, index, source, *, alpha=1, out=None):
    return core.index_add(input, dim, index, source, alpha)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        key, value = _gqa_heads(query, key), _gqa_heads(query, value)
    if dropout_p:
        return _sdpa_with_dropout(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return core.sdpa(query, key, value, attn_mask, 0.0, is_causal, scale)


def _sdpa_with_dropout(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """Attention with dropout on the weights (GPT-2 in training mode), written as torch's math
    backend computes it: scores, mask, softmax, dropout (``dropout`` below), weighted sum. The dropout
    mask comes from kiln's RNG, not eager's, so it is equal in distribution only (as under
    torch.compile); the fused sdpa op keeps dropout_p 0."""
    if not 0 < dropout_p <= 1:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    if is_causal and attn_mask is not None:  # eager's own refusal
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set "
                           "when is_causal=True")
    length, source = query.shape[-2], key.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = core.mul(core.matmul(query, core.transpose(key, -2, -1)), scale)
    if is_causal:
        ones = core.full((length, source), True, torch.bool, query.device)
        scores = core.masked_fill(scores, core.logical_not(core.tril(ones)), float("-inf"))
    if attn_mask is not None:
        scores = core.masked_fill(scores, core.logical_not(attn_mask), float("-inf")) \
            if attn_mask.dtype == torch.bool else core.add(scores, attn_mask)
    weights = dropout(core.softmax(scores, -1), dropout_p, True)  # the mask autograd can see
    return core.matmul(weights, value)


def _gqa_heads(query, kv):
    """Grouped-query attention (``enable_gqa=True``): each key/value head serves
    ``query heads // kv heads`` query heads in a row, torch's ``repeat_interleave`` on dim -3,
    as a broadcast and a reshape (so the sdpa op itself stays plain)."""
    heads, kv_heads = query.shape[-3], kv.shape[-3]
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads % kv_heads:
        raise Unsupported(f"scaled_dot_product_attention(enable_gqa=True) with {heads} query "
                          f"heads and {kv_heads} key/value heads is not supported")
    lead, (length, dim) = tuple(kv.shape[:-3]), tuple(kv.shape[-2:])
    grown = core.expand(core.unsqueeze(kv, -3), lead + (kv_heads, heads // kv_heads, length, dim))
    return core.reshape(grown, lead + (heads, length, dim))


def _conv(nd):
    def adapter(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        stride, dilation = _pair(stride, nd), _pair(dilation, nd)
        if isinstance(padding, str):
            input, padding = _string_padding(input, weight, padding, stride, dilation, nd)
        return core.conv(input, weight, bias, stride, _pair(padding, nd), dilation, groups)
    return adapter


def _string_padding(input, weight, padding, stride, dilation, nd):
    """(input, padding) for ``padding="valid"`` (none) or ``"same"`` (the output keeps the input's
    size: ``dilation * (k - 1)`` split evenly, an odd remainder padded on the right first, as
    torch's own ``_convolution_mode`` does). HF EfficientNet's 'same'/'valid' convolutions
    broke every block's graph (208 breaks, then the recompile limit)."""
    if padding == "valid":
        return input, 0
    if padding != "same":
        raise ValueError(f"Invalid padding string {padding!r}, should be one of ('valid', 'same')")
    if any(s != 1 for s in stride):
        raise RuntimeError("padding='same' is not supported for strided convolutions")
    left, extra = [], []
    for d in range(nd):
        total = dilation[d] * (weight.shape[2 + d] - 1)
        left.append(total // 2)
        extra.append(total % 2)
    if any(extra):
        right = []
        for d in reversed(range(nd)):  # F.pad's order: the last dim first
            right += [0, extra[d]]
        input = core.constant_pad(input, tuple(right), 0.0)
    return input, tuple(left)


def matmul(input, other, *, out=None):
    if out is not None:
        raise Unsupported("matmul(out=...) is not supported")
    if input.ndim == 2 and other.ndim == 2:
        return core.mm(input, other)
    return core.matmul(input, other)


def bmm(input, mat2, *, out=None):
    return core.bmm(input, mat2)


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    return core.addmm(input, mat1, mat2, beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    return core.baddbmm(input, batch1, batch2, beta, alpha)


def gather(input, dim, index, *, sparse_grad=False, out=None):
    return core.gather(input, dim, index)


def index_select(input, dim, index, *, out=None):
    return core.index_select(input, dim, index)


FUNCTIONS = {
    F.layer_norm: layer_norm, F.rms_norm: rms_norm, F.group_norm: group_norm,
    F.batch_norm: batch_norm, F.embedding: embedding,
    F.cross_entropy: cross_entropy, F.nll_loss: nll_loss,
    F.mse_loss: _simple_loss(core.mse_loss), F.l1_loss: _simple_loss(core.l1_loss),
    F.binary_cross_entropy_with_logits: _simple_loss(core.bce_with_logits),
    F.dropout: dropout, F.scaled_dot_product_attention: sdpa,
    F.conv1d: _conv(1), F.conv2d: _conv(2), F.conv3d: _conv(3),
    torch.matmul: matmul, torch.bmm: bmm, torch.addmm: addmm, torch.baddbmm: baddbmm,
    torch.gather: gather, torch.index_select: index_select,
    torch.rand: rand, torch.rand_like: rand_like, torch.scatter_add: scatter_add,
    torch.index_add: index_add, torch.dropout: lambda input, p, train: dropout(input, p, train),
    torch.layer_norm: _torch_layer_norm, torch.group_norm: _torch_group_norm,
    torch.batch_norm: _torch_batch_norm,
    torch.nn.functional.linear: lambda input, weight, bias=None: core.linear(input, weight, bias),
}

METHODS = {
    "matmul": matmul, "bmm": bmm, "gather": gather, "index_select": index_select,
    "addmm": addmm, "baddbmm": baddbmm, "scatter_add": scatter_add, "index_add": index_add,
    "__matmul__": matmul, "uniform_": uniform_, "exponential_": exponential_, "normal_": normal_,
}

BINARY_OPERATORS = {"@": matmul}

from kiln.capture import torch_api_einsum as _einsum  # noqa: E402

FUNCTIONS.update(_einsum.FUNCTIONS)
