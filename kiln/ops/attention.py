"""Attention for training: torch's fused kernels called the way their own autograd calls them.

The forward of a training graph calls ``sdpa_fused``, which runs one fused attention kernel
(cuDNN, flash or memory-efficient on CUDA, flash on the CPU) and returns, besides the
output, what that kernel's backward needs: the log-sum-exp of each row and the kernel's random
state. ``sdpa_fused_backward`` hands them to the same library's backward. Nothing is
recomputed: the probabilities never exist in memory, and the forward runs once.

The kernel is chosen when the graph is compiled (``choose_backend``: torch's own choice for
tensors of these shapes, strides and dtypes) and is an argument of both ops, so the forward
and the backward always agree and the graph caches key on it. When torch would pick its math
fallback (no fused kernel fits), training keeps ``core.sdpa`` and its VJP rule.

Both ops exist as core ops (the joint graph holds them; ``kiln/autograd/rules_nn.py`` has the
VJP rule and the rewrite of ``core.sdpa``) and as library prims of the same name, lowered to
one wrapper call with several outputs (``lowering.extern_multi_rule``).
"""
from __future__ import annotations

import torch

from kiln.meta.symbolic import hint_of
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops.registry import DECOMPOSITIONS, LOWERINGS, META_RULES, define, stage_api

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported


__all__ = ["choose_backend", "BACKENDS"]

A = torch.ops.aten
BACKENDS = ("cudnn", "flash", "efficient", "cpu_flash")


class AttentionError(TypeError):
    pass


# ------------------------------------------------------------------ choosing the kernel
def _example(meta: TensorMeta, requires_grad=False) -> torch.Tensor:
    """An uninitialized tensor with meta's sizes (at their traced values), strides, dtype and
    device: torch's kernel choice reads only those."""
    shape = [hint_of(s) for s in meta.shape]
    stride = [hint_of(s) for s in meta.stride]
    t = torch.empty_strided(shape, stride, dtype=meta.dtype, device=meta.device)
    return t.requires_grad_(requires_grad)


def fused_choice(q, k, v, attn_mask, is_causal, scale, grad=True) -> str | None:
    """The fused kernel torch picks for these metas (``grad``: as if they needed gradients,
    else as they are), or None (its math kernel)."""
    if not all(isinstance(t, TensorMeta) and t.ndim == 4 for t in (q, k, v)):
        return None
    if attn_mask is not None and not isinstance(attn_mask, TensorMeta):
        return None
    if q.device.type not in ("cpu", "cuda"):
        return None
    try:
        key = (tuple(_meta_key(t, grad) for t in (q, k, v, attn_mask)), is_causal, scale, _sdp_flags())
        hash(key)
    except Exception:  # noqa: BLE001 - a symbolic size without a hint: ask torch below
        key = None
    if key is not None and key in _CHOICES:
        return _CHOICES[key]
    try:
        ex = [_example(t, grad or t.requires_grad) for t in (q, k, v)]
        mask = _example(attn_mask) if attn_mask is not None else None
        choice = torch._fused_sdp_choice(*ex, mask, 0.0, is_causal, scale=scale)
    except Exception:  # an old torch, or inputs torch itself refuses: keep the math path
        return None
    from torch.nn.attention import SDPBackend
    names = {SDPBackend.CUDNN_ATTENTION.value: "cudnn", SDPBackend.FLASH_ATTENTION.value: "flash",
             SDPBackend.EFFICIENT_ATTENTION.value: "efficient"}
    name = names.get(choice)
    name = "cpu_flash" if name == "flash" and q.device.type == "cpu" else name
    if key is not None and len(_CHOICES) < 1024:
        _CHOICES[key] = name
    return name


# torch's choice per (metas, causal, scale, enabled kernels): a 12-layer model asks the same
# question 36 times, and each asking allocates three example tensors on the device
_CHOICES: dict = {}


def _meta_key(t, grad):
    if t is None:
        return None
    return (tuple(hint_of(s) for s in t.shape), tuple(hint_of(s) for s in t.stride), t.dtype, t.device,
            bool(grad or t.requires_grad))


def _sdp_flags():
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(),
            getattr(b, "cudnn_sdp_enabled", lambda: None)())


def choose_backend(q, k, v, attn_mask, is_causal, scale) -> str | None:
    """The fused kernel torch would run for these metas with gradients, or None (math)."""
    name = fused_choice(q, k, v, attn_mask, is_causal, scale)
    if attn_mask is not None and q.device.type == "cuda":
        # torch's front end reshapes and pads masks per kernel before these ops see them;
        # masked attention on CUDA keeps the recomputing backward, which calls that front end
        return None
    return name


# ------------------------------------------------------------------ eager forms
_NO_RNG = {}


def _no_rng(device):
    if device not in _NO_RNG:
        _NO_RNG[device] = torch.zeros((), dtype=torch.int64, device=device)
    return _NO_RNG[device]


def _additive(mask, dtype):
    """A boolean mask (True: attend) as the additive mask the kernels take."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _fused_eager(q, k, v, attn_mask, is_causal, scale, backend):
    """(out, logsumexp, rng seed, rng offset) of one fused attention forward."""
    if backend == "cudnn":
        out, lse, _, _, _, _, seed, offset, _ = A._scaled_dot_product_cudnn_attention(
            q, k, v, attn_mask, True, 0.0, is_causal, False, scale=scale)
    elif backend == "flash":
        out, lse, _, _, _, _, seed, offset, _ = A._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal, False, scale=scale)
    elif backend == "efficient":
        out, lse, seed, offset = A._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, True, 0.0, is_causal, scale=scale)
    elif backend == "cpu_flash":
        out, lse = A._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=_additive(attn_mask, q.dtype), scale=scale)
        seed = offset = _no_rng(q.device)
    else:
        raise AttentionError(f"prims.sdpa_fused: unknown backend {backend!r}; expected one of {BACKENDS}")
    return out, lse, seed, offset


def _fused_backward_eager(g, q, k, v, out, lse, seed, offset, attn_mask, is_causal, scale, backend):
    """(grad q, grad k, grad v) from the saved forward state of the same backend."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if backend == "cudnn":
        grads = A._scaled_dot_product_cudnn_attention_backward(
            g, q, k, v, out, lse, seed, offset, attn_mask, None, None, n_q, n_k, 0.0, is_causal,
            scale=scale)
    elif backend == "flash":
        grads = A._scaled_dot_product_flash_attention_backward(
            g, q, k, v, out, lse, None, None, n_q, n_k, 0.0, is_causal, seed, offset, scale=scale)
    elif backend == "efficient":
        grads = A._scaled_dot_product_efficient_attention_backward(
            g, q, k, v, attn_mask, out, lse, seed, offset, 0.0, [True, True, True, False], is_causal,
            scale=scale)
    elif backend == "cpu_flash":
        grads = A._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, out, lse, 0.0, is_causal, attn_mask=_additive(attn_mask, q.dtype), scale=scale)
    else:
        raise AttentionError(f"prims.sdpa_fused_backward: unknown backend {backend!r}")
    return tuple(grads[:3])


# ------------------------------------------------------------------ meta
def _dense_like(shape, order_of: TensorMeta):
    """Strides of a dense tensor of ``shape`` whose dims are laid out in the order of
    ``order_of``'s strides (the fused kernels allocate their results that way: attention over
    ``x.view(B, T, H, D).transpose(1, 2)`` returns a [B, H, T, D] view of [B, T, H, D] memory)."""
    strides = [hint_of(s) for s in order_of.stride]
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], -d))  # outermost first
    if order[-1] != len(shape) - 1 or 0 in strides:
        # the kernels read the head dim as contiguous (CPU flash attention silently computes
        # garbage otherwise), and a broadcast operand (k.expand(-1, H, -1, -1): stride 0, so
        # sorted innermost) says nothing about memory order: row-major then
        order = list(range(len(shape)))
    out = [None] * len(shape)
    step = 1
    for d in reversed(order):
        out[d] = step
        step = step * shape[d]
    return tuple(out)


def _check(q, k, v, backend, name):
    if backend not in BACKENDS:
        raise AttentionError(f"[meta] prims.{name}: unknown backend {backend!r}; expected one of {BACKENDS}")
    if not (q.ndim == k.ndim == v.ndim == 4) or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] \
            or q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1]:
        raise AttentionError(f"[meta] prims.{name}: q {list(q.shape)}, k {list(k.shape)}, "
                             f"v {list(v.shape)} do not fit a fused kernel ([B, H, T, D] each)")


def _fused_meta(q, k, v, attn_mask, is_causal, scale, backend):
    _check(q, k, v, backend, "sdpa_fused")
    b, h, n_q = q.shape[0], q.shape[1], q.shape[2]
    shape = (b, h, n_q, v.shape[-1])
    grad = q.requires_grad or k.requires_grad or v.requires_grad
    out = TensorMeta(shape, _dense_like(shape, q), q.dtype, q.device, grad)
    f32, dev = torch.float32, q.device
    if backend == "cudnn":
        lse = TensorMeta.contiguous((b, h, n_q, 1), f32, dev)
        seed = offset = TensorMeta.contiguous((), torch.int64, dev)
    elif backend == "flash":
        lse = TensorMeta.contiguous((b, h, n_q), f32, dev)
        seed, offset = TensorMeta.contiguous((2,), torch.uint64, dev), TensorMeta.contiguous((), torch.uint64, dev)
    elif backend == "efficient":  # rows padded to a multiple of 32
        lse = TensorMeta.contiguous((b, h, (n_q + 31) // 32 * 32), f32, dev)
        seed = offset = TensorMeta.contiguous((), torch.int64, torch.device("cpu"))
    else:  # cpu_flash: [B, T, H] memory
        lse = TensorMeta((b, h, n_q), (n_q * h, 1, h), f32, dev)
        seed = offset = TensorMeta.contiguous((), torch.int64, dev)
    return out, lse, seed, offset


def _fused_backward_meta(g, q, k, v, out, lse, seed, offset, attn_mask, is_causal, scale, backend):
    _check(q, k, v, backend, "sdpa_fused_backward")
    if tuple(g.shape) != tuple(out.shape):
        raise AttentionError(f"[meta] prims.sdpa_fused_backward: grad {list(g.shape)} does not match "
                             f"the output {list(out.shape)}")
    if backend == "cpu_flash":
        # ATen's CPU backward allocates each grad as [B, T, H, D] memory and returns its
        # transpose, whatever its operand's layout; saying so spares the wrapper a copy per grad
        return tuple(TensorMeta(t.shape, _bthd(t.shape), t.dtype, t.device, False) for t in (q, k, v))
    return tuple(TensorMeta(t.shape, _dense_like(t.shape, t), t.dtype, t.device, False) for t in (q, k, v))


def _bthd(shape):
    """Strides of a [B, H, T, D] view of [B, T, H, D] memory."""
    b, h, t, d = shape
    return (t * h * d, d, h * d, 1)


# ------------------------------------------------------------------ lowering
def _dense_order(shape, stride):
    """The dims of a dense layout, innermost first, read off its strides (symbolic ones too:
    each stride is the product of the sizes inside it); None when the layout is not dense."""
    left, order, step = list(range(len(shape))), [], 1
    while left:
        d = next((d for d in reversed(left) if stride[d] == step), None)
        if d is None:
            return None
        order.append(d)
        left.remove(d)
        step = step * shape[d]
    return order


def _realize_like(ctx, value, order):
    """A kernel-made operand written in ``order`` (innermost first): the fused kernels give
    their results the layout of their operands, so this layout keeps results where the metas
    say they are (q, k, v of ``x.view(B, T, H, D).transpose(1, 2)`` stay [B, T, H, D] memory)."""
    if not isinstance(value, L.TValue) or value.ref is not None or order is None:
        return value
    stride, step = [None] * len(value.shape), 1
    for d in order:
        stride[d] = step
        step = step * value.shape[d]
    ctx.realize(value, stride)
    return value


def _lower_fused(ctx, metas, q, k, v, *rest):
    order = _dense_order(metas[0].shape, metas[0].stride)  # the output's: q's order
    q, k, v = (_realize_like(ctx, t, order) for t in (q, k, v))
    return L.extern_multi_rule(ctx, metas, q, k, v, *rest)


def _lower_fused_backward(ctx, metas, g, q, k, v, *rest):
    q, k, v = (_realize_like(ctx, t, _dense_order(m.shape, m.stride)) for t, m in zip((q, k, v), metas))
    g = _realize_like(ctx, g, _dense_order(metas[0].shape, metas[0].stride))
    return L.extern_multi_rule(ctx, metas, g, q, k, v, *rest)


# ------------------------------------------------------------------ the ops: core and prim
def _pair(name, eager, meta, lowering, **props):
    prim = define("prims", name, eager, library=True)
    META_RULES[prim] = meta
    LOWERINGS[prim] = lowering
    op = define("core", name, eager, **props)
    META_RULES[op] = meta
    DECOMPOSITIONS[op] = prim
    return op, prim


sdpa_fused, prim_sdpa_fused = _pair("sdpa_fused", _fused_eager, _fused_meta, _lower_fused)
sdpa_fused_backward, prim_sdpa_fused_backward = _pair("sdpa_fused_backward", _fused_backward_eager,
                                                      _fused_backward_meta, _lower_fused_backward,
                                                      differentiable=False)  # no double backward
