"""VJP rules for the elementwise core ops of ``core_elementwise_more.py``: rounding (zero
gradient), transcendental functions, pow, clamp, lerp, addcmul/addcdiv, masked_fill,
nan_to_num and the activations. Each mirrors eager autograd's formula (derivatives.yaml),
including its choices at kinks (clamp passes the gradient at the bounds, hardtanh does not).
"""
from __future__ import annotations

import math

from kiln.ops import core
from kiln.ops.registry import VJP_RULES
from kiln.autograd.rules import _one_minus, is_tensor, zeros_like


def _unary(*ops):
    def deco(fn):
        for op in ops:
            VJP_RULES[op] = fn
        return fn
    return deco


# ------------------------------------------------------------------ zero gradient
@_unary(core.floor, core.ceil, core.trunc, core.sign)
def rounding_vjp(g, out, x):
    return (zeros_like(g),)


@VJP_RULES.register(core.round)
def round_vjp(g, out, x, decimals=0):
    return zeros_like(g), None


@VJP_RULES.register(core.floor_divide, core.trunc_divide)
def integer_division_vjp(g, out, a, b):
    return (zeros_like(g) if is_tensor(a) else None), (zeros_like(g) if is_tensor(b) else None)


# ------------------------------------------------------------------ transcendental
@VJP_RULES.register(core.reciprocal)
def reciprocal_vjp(g, out, x):
    return (core.mul(core.neg(g), core.mul(out, out)),)


@VJP_RULES.register(core.exp2)
def exp2_vjp(g, out, x):
    return (core.mul(g, core.mul(out, math.log(2.0))),)


@VJP_RULES.register(core.expm1)
def expm1_vjp(g, out, x):
    return (core.mul(g, core.add(out, 1.0)),)


@VJP_RULES.register(core.log2)
def log2_vjp(g, out, x):
    return (core.div(g, core.mul(x, math.log(2.0))),)


@VJP_RULES.register(core.log10)
def log10_vjp(g, out, x):
    return (core.div(g, core.mul(x, math.log(10.0))),)


@VJP_RULES.register(core.log1p)
def log1p_vjp(g, out, x):
    return (core.div(g, core.add(x, 1.0)),)


@VJP_RULES.register(core.sin)
def sin_vjp(g, out, x):
    return (core.mul(g, core.cos(x)),)


@VJP_RULES.register(core.cos)
def cos_vjp(g, out, x):
    return (core.mul(core.neg(g), core.sin(x)),)


@VJP_RULES.register(core.erf)
def erf_vjp(g, out, x):
    return (core.mul(g, core.mul(core.exp(core.neg(core.mul(x, x))), 2.0 / math.sqrt(math.pi))),)


# ------------------------------------------------------------------ pow / fmod / remainder
@VJP_RULES.register(core.pow)
def pow_vjp(g, out, a, b):
    """d(a^b)/da = b a^(b-1) (0 where b == 0); d(a^b)/db = a^b log(a) (0 where a == 0 <= b)."""
    ga = gb = None
    if is_tensor(a):
        if is_tensor(b):
            local = core.mul(b, core.pow(a, core.sub(b, 1.0)))
            ga = core.where(core.eq(b, 0.0), 0.0, core.mul(g, local))
        elif b == 0:
            ga = zeros_like(g)
        else:
            ga = g if b == 1 else core.mul(g, core.mul(core.pow(a, b - 1), float(b)))
    if is_tensor(b):
        if is_tensor(a):
            gb = core.where(core.logical_and(core.eq(a, 0.0), core.ge(b, 0.0)), 0.0,
                            core.mul(g, core.mul(out, core.log(a))))
        elif a == 0:
            gb = core.where(core.ge(b, 0.0), 0.0, core.mul(g, core.mul(out, -math.inf)))
        else:
            gb = core.mul(g, core.mul(out, math.log(a)))
    return ga, gb


@VJP_RULES.register(core.fmod)
def fmod_vjp(g, out, a, b):
    gb = core.mul(core.neg(g), core.trunc(core.div(a, b))) if is_tensor(b) else None
    return (g if is_tensor(a) else None), gb


@VJP_RULES.register(core.remainder)
def remainder_vjp(g, out, a, b):
    gb = core.mul(core.neg(g), core.floor(core.div(a, b))) if is_tensor(b) else None
    return (g if is_tensor(a) else None), gb


# ------------------------------------------------------------------ clamp / lerp / addc*
@VJP_RULES.register(core.clamp)
def clamp_vjp(g, out, x, min=None, max=None):
    """Inside [min, max] (bounds included) the gradient goes to x, else to the bound that won;
    where min > max the result is max everywhere (eager's clamp_backward_min_max)."""
    keep = None
    if min is not None:
        keep = core.ge(x, min)
    if max is not None:
        le_max = core.le(x, max)
        keep = le_max if keep is None else core.logical_and(keep, le_max)
    gx = core.where(keep, g, 0.0) if is_tensor(x) else None
    g_min = g_max = None
    if is_tensor(min):
        pick = core.lt(x, min)
        if max is not None:
            pick = core.logical_and(pick, core.lt(min, max))
        g_min = core.where(pick, g, 0.0)
    if is_tensor(max):
        pick = core.gt(x, max)
        if min is not None:
            pick = core.logical_or(pick, core.lt(max, min))
        g_max = core.where(pick, g, 0.0)
    return gx, g_min, g_max


@VJP_RULES.register(core.lerp)
def lerp_vjp(g, out, start, end, weight):
    g_start = g_end = g_weight = None
    if is_tensor(start):
        g_start = core.mul(g, _one_minus(weight)) if is_tensor(weight) else core.mul(g, 1.0 - weight)
    if is_tensor(end):
        g_end = core.mul(g, weight)
    if is_tensor(weight):
        g_weight = core.mul(g, core.sub(end, start))
    return g_start, g_end, g_weight


@VJP_RULES.register(core.addcmul)
def addcmul_vjp(g, out, x, t1, t2, value=1):
    gv = g if value == 1 else core.mul(g, value)
    return (g if is_tensor(x) else None,
            core.mul(gv, t2) if is_tensor(t1) else None,
            core.mul(gv, t1) if is_tensor(t2) else None, None)


@VJP_RULES.register(core.addcdiv)
def addcdiv_vjp(g, out, x, t1, t2, value=1):
    gv = g if value == 1 else core.mul(g, value)
    g1 = core.div(gv, t2) if is_tensor(t1) else None
    g2 = core.neg(core.div(core.mul(gv, t1), core.mul(t2, t2))) if is_tensor(t2) else None
    return (g if is_tensor(x) else None), g1, g2, None


# ------------------------------------------------------------------ masked_fill / nan_to_num
@VJP_RULES.register(core.masked_fill)
def masked_fill_vjp(g, out, x, mask, value):
    gv = core.sum(core.where(mask, g, 0.0)) if is_tensor(value) else None
    return core.where(mask, 0.0, g), None, gv


@VJP_RULES.register(core.nan_to_num)
def nan_to_num_vjp(g, out, x, nan=0.0, posinf=None, neginf=None):
    return core.where(core.isfinite(x), g, 0.0), None, None, None


# ------------------------------------------------------------------ activations
SQRT_HALF = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
TANH_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5   # sqrt(2 / pi)
TANH_KAPPA = 0.044715


@VJP_RULES.register(core.gelu)
def gelu_vjp(g, out, x, approximate="none"):
    if approximate == "tanh":
        x_sq = core.mul(x, x)
        inner = core.mul(core.add(x, core.mul(core.mul(x_sq, x), TANH_KAPPA)), TANH_BETA)
        t = core.tanh(inner)
        left = core.mul(core.add(t, 1.0), 0.5)
        right = core.mul(core.mul(core.mul(x, 0.5), _one_minus(core.mul(t, t))),
                         core.mul(core.add(core.mul(x_sq, 3.0 * TANH_KAPPA), 1.0), TANH_BETA))
        return core.mul(g, core.add(left, right)), None
    cdf = core.mul(core.add(core.erf(core.mul(x, SQRT_HALF)), 1.0), 0.5)
    pdf = core.mul(core.exp(core.mul(core.mul(x, x), -0.5)), INV_SQRT_2PI)
    return core.mul(g, core.add(cdf, core.mul(x, pdf))), None


@VJP_RULES.register(core.silu)
def silu_vjp(g, out, x):
    s = core.sigmoid(x)
    return (core.mul(g, core.mul(s, core.add(core.mul(x, _one_minus(s)), 1.0))),)


@VJP_RULES.register(core.hardtanh)
def hardtanh_vjp(g, out, x, min_val=-1.0, max_val=1.0):
    inside = core.logical_and(core.gt(x, min_val), core.lt(x, max_val))
    return core.where(inside, g, 0.0), None, None


@VJP_RULES.register(core.leaky_relu)
def leaky_relu_vjp(g, out, x, negative_slope=0.01):
    return core.where(core.gt(x, 0.0), g, core.mul(g, float(negative_slope))), None


@VJP_RULES.register(core.elu)
def elu_vjp(g, out, x, alpha=1.0):
    return core.where(core.gt(x, 0.0), g, core.mul(g, core.mul(core.exp(x), float(alpha)))), None


@VJP_RULES.register(core.hardsigmoid)
def hardsigmoid_vjp(g, out, x):
    inside = core.logical_and(core.gt(x, -3.0), core.lt(x, 3.0))
    return (core.where(inside, core.div(g, 6.0), 0.0),)


@VJP_RULES.register(core.hardswish)
def hardswish_vjp(g, out, x):
    mid = core.mul(g, core.add(core.div(x, 3.0), 0.5))
    return (core.where(core.lt(x, -3.0), 0.0, core.where(core.le(x, 3.0), mid, g)),)


@VJP_RULES.register(core.mish)
def mish_vjp(g, out, x):
    t = core.tanh(core.softplus(x))
    s = core.sigmoid(x)
    return (core.mul(g, core.add(t, core.mul(core.mul(x, s), _one_minus(core.mul(t, t))))),)


@VJP_RULES.register(core.softplus)
def softplus_vjp(g, out, x, beta=1.0, threshold=20.0):
    scaled = x if beta == 1 else core.mul(x, float(beta))
    return core.where(core.gt(scaled, float(threshold)), g, core.mul(g, core.sigmoid(scaled))), None, None
