"""Elementwise entries: unary and binary math, comparisons, logic and bitwise ops, where, clamp,
pow, lerp, addcmul/addcdiv, conversions, masked_fill and type promotion (Python scalars, 0-d
tensors, mixed dtypes)."""
from __future__ import annotations

import torch

from .common import (ALL, BOOL, FLOATS, INTS, BadInput, OpEntry, binary, rand, ternary,
                     tr, unary, with_scalars)


def nz(b):
    """A divisor without zeros (integers) that keeps its sign."""
    return torch.where(b == 0, b + 3, b) if not b.dtype.is_floating_point else b


def E(name, fn, *rest, **kw):
    """An entry; positional extras are its sample maker (callable) and dtypes (tuple)."""
    samples = next((r for r in rest if callable(r)), unary)
    dtypes = next((r for r in rest if isinstance(r, tuple)), kw.pop("dtypes", ALL))
    return OpEntry(name, fn, samples, dtypes, **kw)


def pos(dtype, device):  # strictly positive floats (log, sqrt, pow of a fractional exponent)
    return unary(dtype, device, special=False, low=0.25, high=3.0)


def mixed(dtypes):
    """Binary samples over two dtypes: each pairing in one shape, broadcast and 0-d."""
    def make(dtype, device):
        other = dtypes
        return [(rand((6, 10), dtype, device), rand((6, 10), other, device)),
                (tr((6, 10), dtype, device), rand((10,), other, device)),
                (rand((6, 10), dtype, device), rand((), other, device)),
                (rand((), dtype, device), rand((6, 10), other, device))]
    return make


def masks(dtype, device):
    """A tensor and a bool mask that broadcasts to it."""
    return [(rand((6, 10), dtype, device), rand((6, 10), torch.bool, device)),
            (tr((6, 10), dtype, device), rand((10,), torch.bool, device)),
            (rand((6, 10), dtype, device), rand((), torch.bool, device)),
            (rand((0, 10), dtype, device), rand((1, 10), torch.bool, device))]




ENTRIES = [
    # ---- binary arithmetic (tensor, tensor): broadcast, non-contiguous, 0-d, empty
    E("add", lambda a, b: a + b, binary, differentiable=True),
    E("add_alpha", lambda a, b: torch.add(a, b, alpha=2), binary, differentiable=True),
    E("sub", lambda a, b: a - b, binary, differentiable=True),
    E("sub_alpha", lambda a, b: a.sub(b, alpha=3), binary, FLOATS, differentiable=True),
    E("mul", lambda a, b: a * b, binary, differentiable=True),
    E("div", lambda a, b: a / (b.abs() + 1), binary, differentiable=True),
    E("maximum", lambda a, b: torch.maximum(a, b), binary, differentiable=True),
    E("minimum", lambda a, b: torch.minimum(a, b), binary, differentiable=True),
    E("eq", lambda a, b: a == b, binary), E("ne", lambda a, b: a != b, binary),
    E("lt", lambda a, b: a < b, binary), E("le", lambda a, b: a <= b, binary),
    E("gt", lambda a, b: a > b, binary), E("ge", lambda a, b: torch.ge(a, b), binary),
    E("floor_divide", lambda a, b: a // nz(b), binary),
    E("div_trunc", lambda a, b: torch.div(a, nz(b), rounding_mode="trunc"), binary),
    E("div_floor", lambda a, b: a.div(nz(b), rounding_mode="floor"), binary),
    E("remainder", lambda a, b: a % nz(b), binary, differentiable=True),
    E("fmod", lambda a, b: torch.fmod(a, nz(b)), binary, differentiable=True),
    E("bitwise", lambda a, b: (a & b) | (a ^ b) | torch.bitwise_not(b), binary, INTS + BOOL),
    E("shifts", lambda a, b: (a << b) ^ (a >> b) ^ (a >> 1), binary, INTS),
    E("logical", lambda a, b: torch.logical_and(a > 0, b) | torch.logical_or(a, b)
      ^ torch.logical_xor(a, b) | torch.logical_not(a), binary, ALL + BOOL),
    # ---- Python scalars on either side, type promotion with them
    E("scalar_right", lambda a, s: a * s + 1, with_scalars(2.5, 3, -1), differentiable=True),
    E("scalar_left", lambda a, s: s - a, with_scalars(3, 0.5), differentiable=True),
    E("scalar_compare", lambda a, s: (a > s) & (a != s), with_scalars(0.5, 2)),
    E("floor_divide_scalar", lambda a, s: torch.floor_divide(a, s) + a % s, with_scalars(-3, 2.5)),
    E("bool_scalar", lambda a, s: a & s, with_scalars(True, False), BOOL),
    # ---- mixed tensor dtypes (torch's priority classes: 0-d tensors and scalars lower)
    E("int_plus_float", lambda a, b: a + b, mixed(torch.float32), INTS + (torch.float16,)),
    E("half_times_bf16", lambda a, b: a * b, mixed(torch.bfloat16), (torch.float16,)),
    E("bool_plus_int", lambda a, b: torch.where(a, b, -b), mixed(torch.int64), BOOL),
    E("int_div_int", lambda a, b: a / (b.abs() + 1), mixed(torch.int32), (torch.int64,)),
    # ---- unary math
    E("neg", lambda a: -a, differentiable=True),
    E("abs", lambda a: torch.abs(a), differentiable=True),
    E("relu", lambda a: torch.relu(a), differentiable=True),
    E("exp", lambda a: torch.exp(a), differentiable=True),
    E("exp2", lambda a: torch.exp2(a), FLOATS + INTS[:1], differentiable=True),
    E("expm1", lambda a: torch.expm1(a * 0.01) + a.expm1(), FLOATS, differentiable=True),
    E("log", lambda a: torch.log(a), pos, FLOATS, differentiable=True),
    E("log_special", lambda a: torch.log(a), unary, FLOATS + INTS),
    E("log2", lambda a: torch.log2(a.abs() + 0.1), differentiable=True),
    E("log10", lambda a: torch.log10(a), pos, FLOATS, differentiable=True),
    E("log1p", lambda a: torch.log1p(a), pos, differentiable=True),
    E("sqrt", lambda a: a.sqrt(), pos, differentiable=True),
    E("rsqrt", lambda a: torch.rsqrt(a), pos, FLOATS, differentiable=True),
    E("tanh", lambda a: torch.tanh(a), differentiable=True),
    E("sigmoid", lambda a: a.sigmoid(), differentiable=True),
    E("sin_cos", lambda a: torch.sin(a) + torch.cos(a), differentiable=True),
    E("erf", lambda a: torch.erf(a), differentiable=True),
    E("reciprocal", lambda a: torch.reciprocal(a), FLOATS, differentiable=True),
    E("square", lambda a: torch.square(a), differentiable=True),
    E("floor", lambda a: torch.floor(a)), E("ceil", lambda a: a.ceil()),
    E("trunc", lambda a: torch.trunc(a)), E("round", lambda a: torch.round(a * 2)),
    E("round_decimals", lambda a: torch.round(a, decimals=2), dtypes=FLOATS),
    E("sign", lambda a: torch.sign(a)),
    E("isnan_isinf", lambda a: torch.isnan(a) | torch.isinf(a) ^ torch.isfinite(a)),
    E("nan_to_num", lambda a: torch.nan_to_num(a) + a.nan_to_num(nan=1.0, posinf=2.0, neginf=-2.0),
      differentiable=True),
    E("bitwise_not", lambda a: ~a, dtypes=INTS + BOOL),
    # ---- pow
    E("pow_tensor", lambda a, b: torch.pow(a.abs() + 0.5, b), binary, FLOATS, differentiable=True),
    E("pow_neg_base_int_exp", lambda a, b: torch.pow(-a.abs(), torch.round(b * 2)), binary, FLOATS),
    # eager rounds each term (up to ~20 for a ** 3) to the half type before the sums; the fused
    # kernel rounds once, so half-precision results differ by a few ulps of the largest term
    E("pow_scalar_exp", lambda a: a ** 2 + a ** 3 + a.abs() ** 0.5 - (a.abs() + 0.5) ** -1.5,
      dtypes=FLOATS, differentiable=True,
      tol={torch.float16: (4e-3, 2e-2), torch.bfloat16: (1.6e-2, 1.5e-1)}),
    E("pow_float_scalar", lambda a: a.abs() ** 1.7 + torch.pow(a, 3.0), dtypes=FLOATS),
    E("pow_int", lambda a: a ** 2 + a.pow(3) + a ** 0, dtypes=INTS),
    E("rpow", lambda a: 2 ** a + 0.5 ** a, dtypes=FLOATS, differentiable=True),
    # ---- where, clamp, lerp, addcmul/addcdiv, masked_fill
    E("where", lambda a, b: torch.where(a > b, a, b * 2), binary, differentiable=True),
    E("where_scalar", lambda a, b: torch.where(a > 0, a, 0.5) + torch.where(b < 0, 1, b), binary,
      FLOATS, differentiable=True),
    E("clamp", lambda a: torch.clamp(a, -1, 1) + a.clamp(min=0) + a.clamp_max(2), differentiable=True),
    E("clamp_tensor", lambda a, lo, hi: torch.clip(a, lo, hi), ternary, differentiable=True),
    E("clamp_float_bound_on_int", lambda a: torch.clamp(a, min=0.5)),
    E("lerp", lambda a, b, w: torch.lerp(a, b, 0.3) + a.lerp(b, w), ternary, FLOATS,
      differentiable=True),
    E("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5) + a.addcmul(b, c), ternary,
      differentiable=True),
    E("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c.abs() + 1, value=2), ternary, FLOATS,
      differentiable=True),
    E("masked_fill", lambda a, m: a.masked_fill(m, -1) + torch.masked_fill(a, ~m, 3), masks,
      differentiable=True),
    # ---- conversions
    E("to_dtype", lambda a: a.to(torch.float32) * 2 + a.to(torch.int32), differentiable=True),
    E("type_conversions", lambda a: a.type(torch.float32) + a.double() + a.half().float()),
    E("int_round_trip", lambda a: a.to(torch.int32).to(a.dtype) + a.long().to(a.dtype)),
    E("to_bool", lambda a: a.bool() | a.to(torch.bool), dtypes=ALL),
    E("from_bool", lambda a: a.to(torch.float16) + a.int() + a.long(), dtypes=BOOL),
]


BAD = [
    BadInput("add_shape_mismatch", lambda a, b: a + b,
             lambda: (torch.randn(3, 4), torch.randn(5))),
    BadInput("mul_shape_mismatch", lambda a, b: torch.mul(a, b),
             lambda: (torch.randn(2, 3), torch.randn(3, 2))),
    BadInput("where_cond_not_bool", lambda c, a: torch.where(c, a, 0.0),
             lambda: (torch.randn(3), torch.randn(3))),
    BadInput("bitwise_on_float", lambda a, b: a & b,
             lambda: (torch.randn(3), torch.randn(3))),
    BadInput("lerp_dtype_mismatch", lambda a, b: torch.lerp(a, b, 0.5),
             lambda: (torch.randn(3), torch.randn(3, dtype=torch.float64))),
]
