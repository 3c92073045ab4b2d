"""More elementwise core ops: rounding, transcendental, integer division and remainder, logical
and bitwise ops, NaN/inf tests, clamp, pow, lerp, addcmul/addcdiv, masked_fill, and the
activation functions. Each has its eager implementation, meta rule and decomposition to prims
right here.

Activations decompose in float32 for half-precision inputs (eager's "opmath") and cast back.
"""
from __future__ import annotations

import builtins
import math

import torch
import torch.nn.functional as F

from kiln.graph.proxy import Proxy
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops import prims_more as pm
from kiln.ops.prim_utils import broadcast_to, elementwise_operands, to_dtype
from kiln.ops.promotion import (Promotion, broadcast_shapes, is_bool, no_kernel, not_float,
                                promoted_dtypes, refuse_dtypes, scalar_for)
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, POINTWISE, define

__all__ = ["floor", "ceil", "trunc", "round", "sign", "reciprocal", "exp2", "expm1", "log2",
           "log10", "log1p", "sin", "cos", "erf", "isnan", "isinf", "isfinite", "logical_not",
           "bitwise_not", "pow", "fmod", "remainder", "floor_divide", "trunc_divide",
           "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
           "bitwise_left_shift", "bitwise_right_shift", "clamp", "lerp", "addcmul", "addcdiv", "masked_fill", "nan_to_num", "gelu", "silu",
           "hardtanh", "leaky_relu", "elu", "hardswish", "hardsigmoid", "mish", "softplus"]

LOW = (torch.float16, torch.bfloat16)


class ElementwiseError(TypeError):
    pass


def _core(name, eager, **props):
    return define("core", name, eager, **{**POINTWISE, **props})


# Integer-only ops are not recomputed in a backward (no float graph reads them there);
# predicates and integer ops have nothing to differentiate.
_INTEGRAL = {"recompute": False, "differentiable": False}


def _meta_of(name, kind, n_operands=None):
    """Elementwise meta over the first n_operands arguments (the rest are attributes)."""
    from kiln.ops.core import elementwise_meta
    rule = elementwise_meta(name, kind)

    def meta(*args, **kwargs):
        operands = args if n_operands is None else args[:n_operands]
        return rule(*(a for a in operands if a is not None))
    return meta


def _operands(args, kind):
    return elementwise_operands([a for a in args if a is not None], kind)


def _is_t(x):
    return isinstance(x, Proxy)


def _is_int(dtype):
    return not dtype.is_floating_point and not dtype.is_complex


def _opmath(x):
    return to_dtype(x, torch.float32) if x.dtype in LOW else x


# ------------------------------------------------------------------ unary
def _unary_prim(prim):
    def decomp(x):
        (x,), _, _ = _operands((x,), Promotion.INT_TO_FLOAT)
        return prim(x)
    return decomp


_TRANSCENDENTAL = {
    "exp2": (torch.exp2, pm.exp2), "expm1": (torch.expm1, pm.expm1), "log2": (torch.log2, pm.log2),
    "log10": (torch.log10, pm.log10), "log1p": (torch.log1p, pm.log1p), "sin": (torch.sin, pm.sin),
    "cos": (torch.cos, pm.cos), "erf": (torch.erf, pm.erf),
}
_defined = {}
for _name, (_eager, _prim) in _TRANSCENDENTAL.items():
    _op = _core(_name, _eager)
    META_RULES[_op] = _meta_of(_name, Promotion.INT_TO_FLOAT)
    DECOMPOSITIONS[_op] = _unary_prim(_prim)
    _defined[_name] = _op
exp2, expm1, log2, log10 = (_defined[n] for n in ("exp2", "expm1", "log2", "log10"))
log1p, sin, cos, erf = (_defined[n] for n in ("log1p", "sin", "cos", "erf"))


def _rounding(prim):
    def decomp(x):
        return x if _is_int(x.dtype) else prim(x)  # integers are already whole
    return decomp


floor = _core("floor", torch.floor)
ceil = _core("ceil", torch.ceil)
trunc = _core("trunc", torch.trunc)
for _op, _prim in ((floor, pm.floor), (ceil, pm.ceil), (trunc, pm.trunc)):
    META_RULES[_op] = _meta_of(_op.name, Promotion.DEFAULT)
    DECOMPOSITIONS[_op] = _rounding(_prim)
    refuse_dtypes(META_RULES, _op, is_bool, (lambda k: lambda d: no_kernel(d, k))(f"{_op.name}_vml_cpu"))


def _device_type(x):
    return getattr(x.device, "type", str(x.device))


def _round_eager(x, decimals=0):
    return torch.round(x, decimals=decimals) if decimals else torch.round(x)


round = _core("round", _round_eager)
META_RULES[round] = _meta_of("round", Promotion.DEFAULT, 1)
refuse_dtypes(META_RULES, round, is_bool, lambda d: no_kernel(d, "round_vml_cpu"))


@DECOMPOSITIONS.register(round)
def _round_decomp(x, decimals=0):
    if _is_int(x.dtype):
        return x
    if not decimals:
        return pm.round(x)
    scale = 10.0 ** builtins.abs(decimals)
    if x.dtype in LOW and _device_type(x) == "cuda":
        # torch's CUDA kernel rounds the scaled value to the half type before rounding to an
        # integer (the CPU kernel keeps it in float): match each device bit for bit
        scaled = to_dtype(prims.mul(_opmath(x), scale) if decimals > 0 else prims.div(_opmath(x), scale), x.dtype)
        r = pm.round(_opmath(scaled))
        return to_dtype(prims.div(r, scale) if decimals > 0 else prims.mul(r, scale), x.dtype)
    if x.dtype in LOW:
        return to_dtype(_round_decomp(_opmath(x), decimals), x.dtype)
    if decimals > 0:
        return prims.div(pm.round(prims.mul(x, scale)), scale)
    return prims.mul(pm.round(prims.div(x, scale)), scale)


sign = _core("sign", torch.sign)
META_RULES[sign] = _meta_of("sign", Promotion.DEFAULT)


@DECOMPOSITIONS.register(sign)
def _sign_decomp(x):
    if x.dtype == torch.bool:
        return x
    zero = scalar_for(0, x.dtype)
    # (x > 0) - (x < 0): NaN gives 0, as eager's sign does. Half precision goes through float32.
    wide = torch.float32 if x.dtype in LOW else x.dtype
    diff = prims.sub(to_dtype(prims.gt(x, zero), wide), to_dtype(prims.lt(x, zero), wide))
    return to_dtype(diff, x.dtype)


reciprocal = _core("reciprocal", torch.reciprocal)
META_RULES[reciprocal] = _meta_of("reciprocal", Promotion.INT_TO_FLOAT)


@DECOMPOSITIONS.register(reciprocal)
def _reciprocal_decomp(x):
    (x,), compute, _ = _operands((x,), Promotion.INT_TO_FLOAT)
    return prims.div(scalar_for(1, compute), x)


isnan = _core("isnan", torch.isnan, differentiable=False)
isinf = _core("isinf", torch.isinf, differentiable=False)
isfinite = _core("isfinite", torch.isfinite, differentiable=False)
logical_not = _core("logical_not", torch.logical_not, differentiable=False)
for _op in (isnan, isinf, isfinite, logical_not):
    META_RULES[_op] = _meta_of(_op.name, Promotion.ALWAYS_BOOL)


@DECOMPOSITIONS.register(isnan)
def _isnan_decomp(x):
    return prims.ne(x, x)


@DECOMPOSITIONS.register(isinf)
def _isinf_decomp(x):
    if not x.dtype.is_floating_point:
        return prims.ne(x, x)  # all False
    return prims.eq(prims.abs(x), math.inf)


@DECOMPOSITIONS.register(isfinite)
def _isfinite_decomp(x):
    if not x.dtype.is_floating_point:
        return prims.eq(x, x)  # all True
    return prims.lt(prims.abs(x), math.inf)  # NaN compares False


def _as_bool(x):
    if not _is_t(x):
        return builtins.bool(x)
    return x if x.dtype == torch.bool else prims.ne(x, scalar_for(0, x.dtype))


@DECOMPOSITIONS.register(logical_not)
def _logical_not_decomp(x):
    return prims.eq(_as_bool(x), False)


bitwise_not = _core("bitwise_not", torch.bitwise_not, **_INTEGRAL)
META_RULES[bitwise_not] = _meta_of("bitwise_not", Promotion.DEFAULT)


@DECOMPOSITIONS.register(bitwise_not)
def _bitwise_not_decomp(x):
    if x.dtype == torch.bool:
        return prims.eq(x, False)
    if not _is_int(x.dtype):
        raise ElementwiseError(f"[decomposition] core.bitwise_not: not defined for {x.dtype}")
    return pm.bitwise_not(x)


# ------------------------------------------------------------------ binary
def _binary(name, eager, kind=Promotion.DEFAULT, **props):
    op = _core(name, eager, **props)
    META_RULES[op] = _meta_of(name, kind, 2)
    return op


pow = _binary("pow", torch.pow)


def _pow_meta(a, b):
    out = _meta_of("pow", Promotion.DEFAULT, 2)(a, b)
    if _is_int(out.dtype) and isinstance(b, int) and not isinstance(b, bool) and b < 0:
        raise RuntimeError("[meta] core.pow: Integers to negative integer powers are not allowed.")
    return out


META_RULES[pow] = _pow_meta
fmod = _binary("fmod", torch.fmod)
remainder = _binary("remainder", torch.remainder)
floor_divide = _binary("floor_divide", torch.floor_divide, recompute=False)
trunc_divide = _binary("trunc_divide", lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                       recompute=False)
logical_and = _binary("logical_and", torch.logical_and, Promotion.ALWAYS_BOOL, differentiable=False)
logical_or = _binary("logical_or", torch.logical_or, Promotion.ALWAYS_BOOL, differentiable=False)
logical_xor = _binary("logical_xor", torch.logical_xor, Promotion.ALWAYS_BOOL, differentiable=False)
bitwise_and = _binary("bitwise_and", torch.bitwise_and, **_INTEGRAL)
bitwise_or = _binary("bitwise_or", torch.bitwise_or, **_INTEGRAL)
bitwise_xor = _binary("bitwise_xor", torch.bitwise_xor, **_INTEGRAL)
bitwise_left_shift = _binary("bitwise_left_shift", torch.bitwise_left_shift, eager_layout=None, **_INTEGRAL)
bitwise_right_shift = _binary("bitwise_right_shift", torch.bitwise_right_shift, eager_layout=None, **_INTEGRAL)


def _integral_meta(name, rule):
    """Meta of a bitwise op: integer or bool operands only (eager raises on floats)."""
    def meta(*args, **kwargs):
        out = rule(*args, **kwargs)
        if not _is_int(out.dtype):
            raise ElementwiseError(f"[meta] core.{name}: not defined for {out.dtype}")
        return out
    return meta


for _op in (bitwise_and, bitwise_or, bitwise_xor, bitwise_not, bitwise_left_shift, bitwise_right_shift):
    META_RULES[_op] = _integral_meta(_op.name, META_RULES[_op])


def _shift_meta(rule, name):
    def meta(*args, **kwargs):
        out = rule(*args, **kwargs)
        if out.dtype == torch.bool:  # eager: NotImplementedError, "not implemented for 'Bool'"
            raise ElementwiseError(f"[meta] core.{name}: not defined for {out.dtype}")
        return out
    return meta


for _op in (bitwise_left_shift, bitwise_right_shift):
    META_RULES[_op] = _shift_meta(META_RULES[_op], _op.name)


def _int_power(x, n: int):
    """x ** n for a non-negative Python int n, by repeated squaring (exact for integers)."""
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else prims.mul(result, base)
        n >>= 1
        if n:
            base = prims.mul(base, base)
    return result


@DECOMPOSITIONS.register(pow)
def _pow_decomp(a, b):
    (a, b), compute, _ = _operands((a, b), Promotion.DEFAULT)
    if compute in LOW:  # eager computes half-precision powers in float32
        a, b = (_opmath(v) if _is_t(v) else v for v in (a, b))
        return to_dtype(_pow_decomp(a, b), compute)
    if not _is_t(b):
        if _is_int(compute):
            if b < 0:
                raise ElementwiseError("[decomposition] core.pow: integers to negative integer powers "
                                       "are not allowed")
            return _int_power(a, b) if b else prims.add(prims.mul(a, 0), 1)
        special = {1.0: lambda: a, 2.0: lambda: prims.mul(a, a),
                   3.0: lambda: prims.mul(prims.mul(a, a), a), 0.5: lambda: prims.sqrt(a),
                   -0.5: lambda: prims.rsqrt(a), -1.0: lambda: prims.div(1.0, a),
                   -2.0: lambda: prims.div(1.0, prims.mul(a, a))}
        if b in special:
            return special[b]()
    elif _is_int(compute):
        return _int_power_tensor(a, b, compute)
    return pm.pow(a, b)


def _wrap(value: int, dtype) -> int:
    """value as the integer dtype holds it (two's complement wrap-around)."""
    bits = 8 * dtype.itemsize
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.is_signed and value >> (bits - 1) else value


def _int_power_tensor(a, b, dtype):
    """Integer a ** b for a tensor exponent b, as eager's powi: square-and-multiply over every
    bit of b (products wrap, as eager's do); a negative exponent gives 1 for a base of 1,
    +-1 by parity for -1, else 0 (eager raises only for a negative Python scalar exponent)."""
    bits = 8 * dtype.itemsize - (1 if dtype.is_signed else 0)
    result = prims.add(prims.mul(b, 0), 1)
    base = a
    for k in range(bits):
        if not _is_t(base) and base in (0, 1):  # a constant base's later powers: all 0 or all 1
            if base == 0:
                result = prims.where(prims.ge(b, 1 << k), 0, result)
            break
        bit = prims.ne(pm.bitwise_and(b, 1 << k), 0)
        result = prims.where(bit, prims.mul(result, base), result)
        if k + 1 < bits:
            base = prims.mul(base, base) if _is_t(base) else _wrap(base * base, dtype)
    if not dtype.is_signed:
        return result
    odd_sign = prims.sub(1, prims.mul(pm.bitwise_and(b, 1), 2))  # (-1) ** b
    if _is_t(a):
        negative = prims.where(prims.eq(a, -1), odd_sign, to_dtype(prims.eq(a, 1), dtype))
    else:
        negative = odd_sign if a == -1 else prims.add(prims.mul(b, 0), int(a == 1))
    return prims.where(prims.lt(b, 0), negative, result)


def _lt0(v):
    return prims.lt(v, scalar_for(0, v.dtype)) if _is_t(v) else v < 0


def _ne0(v):
    return prims.ne(v, scalar_for(0, v.dtype)) if _is_t(v) else v != 0


def _and(p, q):
    if not _is_t(p) and not _is_t(q):
        return p and q
    if not _is_t(p):
        p, q = q, p
    if not _is_t(q):
        return p if q else prims.ne(p, p)  # p & False: all False
    return pm.bitwise_and(p, q)


def _xor(p, q):
    if not _is_t(p) and not _is_t(q):
        return p != q
    if not _is_t(p):
        p, q = q, p
    if not _is_t(q):
        return prims.eq(p, False) if q else p
    return prims.ne(p, q)


def _needs_adjust(mod, b):
    """(mod != 0) & ((mod < 0) != (b < 0)): where C's fmod and Python's floor mod differ."""
    return _and(_ne0(mod), _xor(_lt0(mod), _lt0(b)))


@DECOMPOSITIONS.register(fmod)
def _fmod_decomp(a, b):
    (a, b), _, _ = _operands((a, b), Promotion.DEFAULT)
    return pm.fmod(a, b)


@DECOMPOSITIONS.register(remainder)
def _remainder_decomp(a, b):
    (a, b), _, _ = _operands((a, b), Promotion.DEFAULT)
    mod = pm.fmod(a, b)
    return prims.where(_needs_adjust(mod, b), prims.add(mod, b), mod)


@DECOMPOSITIONS.register(trunc_divide)
def _trunc_divide_decomp(a, b):
    (a, b), compute, _ = _operands((a, b), Promotion.DEFAULT)
    if _is_int(compute):
        return pm.trunc_div(a, b)
    quotient = prims.div(a, b)
    if compute in LOW:  # eager rounds the quotient to the half type before truncating it
        quotient = to_dtype(to_dtype(quotient, torch.float32), compute)
    return pm.trunc(quotient)


@DECOMPOSITIONS.register(floor_divide)
def _floor_divide_decomp(a, b):
    (a, b), compute, _ = _operands((a, b), Promotion.DEFAULT)
    mod = pm.fmod(a, b)
    if _is_int(compute):
        # eager's div_floor_integer: one less where the signs differ and the division is not
        # exact. The dividend's sign is the remainder's wherever it is nonzero, except for a
        # zero divisor on CUDA (no error there): this form gives CUDA eager's value for it too.
        q = pm.trunc_div(a, b)
        return prims.where(_and(_ne0(mod), _xor(_lt0(a), _lt0(b))), prims.sub(q, 1), q)
    # eager's div_floor for floats: exact quotient of (a - fmod(a, b)) / b, then rounded
    quotient = prims.div(a, b)
    div = prims.div(prims.sub(a, mod), b)
    div = prims.where(_needs_adjust(mod, b), prims.sub(div, 1.0), div)
    fl = pm.floor(div)
    fl = prims.where(prims.gt(prims.sub(div, fl), 0.5), prims.add(fl, 1.0), fl)
    out = prims.where(prims.ne(div, 0.0), fl, prims.mul(quotient, 0.0))  # copysign(0, a / b)
    if _is_t(b):
        out = prims.where(prims.eq(b, 0.0), quotient, out)
    elif b == 0:
        out = quotient
    return out


def _logical(prim):
    def decomp(a, b):
        shape = broadcast_shapes(*(t.shape for t in (a, b) if _is_t(t)))
        a, b = _as_bool(a), _as_bool(b)
        a = broadcast_to(a, shape) if _is_t(a) else a
        b = broadcast_to(b, shape) if _is_t(b) else b
        return prim(a, b)
    return decomp


DECOMPOSITIONS[logical_and] = _logical(pm.bitwise_and)
DECOMPOSITIONS[logical_or] = _logical(pm.bitwise_or)
DECOMPOSITIONS[logical_xor] = _logical(pm.bitwise_xor)


def _bitwise(prim):
    def decomp(a, b):
        (a, b), compute, _ = _operands((a, b), Promotion.DEFAULT)
        if not _is_int(compute):
            raise ElementwiseError(f"[decomposition] core.{prim.name}: not defined for {compute}")
        return prim(a, b)
    return decomp


DECOMPOSITIONS[bitwise_and] = _bitwise(pm.bitwise_and)
DECOMPOSITIONS[bitwise_or] = _bitwise(pm.bitwise_or)
DECOMPOSITIONS[bitwise_xor] = _bitwise(pm.bitwise_xor)
DECOMPOSITIONS[bitwise_left_shift] = _bitwise(pm.shift_left)
DECOMPOSITIONS[bitwise_right_shift] = _bitwise(pm.shift_right)


# ------------------------------------------------------------------ clamp / lerp / addc*
def _clamp_eager(x, min=None, max=None):
    return torch.clamp(x, min=min, max=max)


clamp = _core("clamp", _clamp_eager)
META_RULES[clamp] = _meta_of("clamp", Promotion.DEFAULT, 3)


@DECOMPOSITIONS.register(clamp)
def _clamp_decomp(x, min=None, max=None):
    if min is None and max is None:
        raise ElementwiseError("[decomposition] core.clamp: at least one of min and max is needed")
    ops, _, _ = _operands((x, min, max), Promotion.DEFAULT)
    x, rest = ops[0], ops[1:]
    if min is not None:
        x = prims.maximum(x, rest.pop(0))
    if max is not None:
        x = prims.minimum(x, rest.pop(0))
    return x


lerp = _core("lerp", torch.lerp)


@META_RULES.register(lerp)
def _lerp_meta(start, end, weight):
    dtypes = {t.dtype for t in (start, end, weight) if isinstance(t, TensorMeta)}
    if len(dtypes) > 1:  # eager lerp does not promote: every tensor operand has one dtype
        raise ElementwiseError(f"[meta] core.lerp: expected one dtype, got {sorted(map(str, dtypes))}")
    return _meta_of("lerp", Promotion.DEFAULT, 3)(start, end, weight)


@DECOMPOSITIONS.register(lerp)
def _lerp_decomp(start, end, weight):
    (start, end, weight), compute, _ = _operands((start, end, weight), Promotion.DEFAULT)
    diff = prims.sub(end, start)
    # eager's two-sided form: exact at weight 0 and at weight 1
    if not _is_t(weight):
        if builtins.abs(weight) < 0.5:
            return prims.add(start, prims.mul(diff, weight))
        return prims.sub(end, prims.mul(diff, 1.0 - weight))
    low = prims.add(start, prims.mul(weight, diff))
    high = prims.sub(end, prims.mul(diff, prims.sub(1.0, weight)))
    return prims.where(prims.lt(prims.abs(weight), 0.5), low, high)


def _addc_eager(fn):
    def run(x, t1, t2, value=1):
        return fn(x, t1, t2, value=value)
    return run


addcmul = _core("addcmul", _addc_eager(torch.addcmul))
addcdiv = _core("addcdiv", _addc_eager(torch.addcdiv))
META_RULES[addcmul] = _meta_of("addcmul", Promotion.DEFAULT, 3)
META_RULES[addcdiv] = _meta_of("addcdiv", Promotion.DEFAULT, 3)


def _addc(prim):
    def decomp(x, t1, t2, value=1):
        if _is_t(value):  # a tensor value (compiled optimizers: Adam's ``value=-step_size``)
            (x, t1, t2, value), compute, _ = _operands((x, t1, t2, value), Promotion.DEFAULT)
        else:
            (x, t1, t2), compute, _ = _operands((x, t1, t2), Promotion.DEFAULT)
        if prim is prims.div and _is_int(compute):
            raise ElementwiseError("[decomposition] core.addcdiv: integer division is not supported, "
                                   "as in eager")
        scaled = prims.mul(t1, value) if _is_t(value) else \
            t1 if value == 1 else prims.mul(t1, scalar_for(value, compute))
        return prims.add(x, prim(scaled, t2))
    return decomp


DECOMPOSITIONS[addcmul] = _addc(prims.mul)
DECOMPOSITIONS[addcdiv] = _addc(prims.div)


# ------------------------------------------------------------------ masked_fill / nan_to_num
masked_fill = _core("masked_fill", torch.masked_fill)


@META_RULES.register(masked_fill)
def _masked_fill_meta(x, mask, value):
    if mask.dtype != torch.bool:
        raise ElementwiseError(f"[meta] core.masked_fill: mask must be bool, got {mask.dtype}")
    if broadcast_shapes(x.shape, mask.shape) != tuple(x.shape):
        raise ElementwiseError(f"[meta] core.masked_fill: mask {list(mask.shape)} does not broadcast "
                               f"to {list(x.shape)}")
    if isinstance(value, TensorMeta) and value.ndim:
        raise ElementwiseError("[meta] core.masked_fill: value must be a 0-dim tensor or a number")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(masked_fill)
def _masked_fill_decomp(x, mask, value):
    mask = broadcast_to(mask, x.shape)
    value = broadcast_to(to_dtype(value, x.dtype), x.shape) if _is_t(value) else scalar_for(value, x.dtype)
    return prims.where(mask, value, x)


def _nan_to_num_eager(x, nan=0.0, posinf=None, neginf=None):
    return torch.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


nan_to_num = _core("nan_to_num", _nan_to_num_eager)
META_RULES[nan_to_num] = _meta_of("nan_to_num", Promotion.DEFAULT, 1)


@DECOMPOSITIONS.register(nan_to_num)
def _nan_to_num_decomp(x, nan=0.0, posinf=None, neginf=None):
    if not x.dtype.is_floating_point:  # nothing to replace: a copy (eager's never aliases x)
        return prims.copy(x)
    info = torch.finfo(x.dtype)
    nan = 0.0 if nan is None else nan  # None means the default, as in eager
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = prims.where(prims.ne(x, x), float(nan), x)
    out = prims.where(prims.eq(x, math.inf), float(posinf), out)
    return prims.where(prims.eq(x, -math.inf), float(neginf), out)


# ------------------------------------------------------------------ activations
def _activation(name, eager, n_attrs=0, floats_only=True):
    op = _core(name, eager)
    META_RULES[op] = _meta_of(name, Promotion.DEFAULT, 1)
    if floats_only:  # eager's activation kernels exist for floating types only
        refuse_dtypes(META_RULES, op, not_float, lambda d: no_kernel(d, f"{name}_cpu"))
    return op


def _in_opmath(fn):
    """Decompose in float32 for half-precision inputs, then cast back (eager's opmath)."""
    def decomp(x, *args, **kwargs):
        if not x.dtype.is_floating_point:
            raise ElementwiseError(f"[decomposition] activation on {x.dtype} is not supported")
        return to_dtype(fn(_opmath(x), *args, **kwargs), x.dtype)
    return decomp


def _relu6_of(v):
    return prims.minimum(prims.maximum(v, 0.0), 6.0)


gelu = _activation("gelu", lambda x, approximate="none": F.gelu(x, approximate=approximate))


@DECOMPOSITIONS.register(gelu)
@_in_opmath
def _gelu_decomp(x, approximate="none"):
    if approximate == "tanh":
        inner = prims.mul(prims.add(x, prims.mul(prims.mul(prims.mul(x, x), x), 0.044715)),
                          math.sqrt(2.0 / math.pi))
        return prims.mul(prims.mul(x, 0.5), prims.add(prims.tanh(inner), 1.0))
    if approximate != "none":
        raise ElementwiseError(f"[decomposition] core.gelu: approximate={approximate!r}")
    return prims.mul(prims.mul(x, 0.5), prims.add(pm.erf(prims.mul(x, math.sqrt(0.5))), 1.0))


silu = _activation("silu", F.silu)
DECOMPOSITIONS[silu] = _in_opmath(lambda x: prims.mul(x, prims.sigmoid(x)))

hardtanh = _activation("hardtanh", lambda x, min_val=-1.0, max_val=1.0: F.hardtanh(x, min_val, max_val),
                       floats_only=False)  # eager clamps integers too (bools it refuses)
refuse_dtypes(META_RULES, hardtanh, is_bool, lambda d: RuntimeError(
    "[meta] Bool inputs not supported for hardtanh"))
_hardtanh_meta = META_RULES[hardtanh]


@META_RULES.register(hardtanh)
def _hardtanh_unsigned(x, min_val=-1.0, max_val=1.0):
    if x.dtype == torch.uint8 and (min_val < 0 or max_val < 0):
        raise RuntimeError("[meta] cannot do hardtanh on an unsigned type with negative limits")
    return _hardtanh_meta(x, min_val, max_val)
_hardtanh_float = _in_opmath(
    lambda x, min_val=-1.0, max_val=1.0: prims.minimum(prims.maximum(x, float(min_val)), float(max_val)))


@DECOMPOSITIONS.register(hardtanh)
def _hardtanh_decomp(x, min_val=-1.0, max_val=1.0):
    if x.dtype.is_floating_point:
        return _hardtanh_float(x, min_val, max_val)
    # integers clamp to the bounds cast to the tensor's type (as eager's integer kernel)
    return prims.minimum(prims.maximum(x, scalar_for(min_val, x.dtype)), scalar_for(max_val, x.dtype))

leaky_relu = _activation("leaky_relu", lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope))
DECOMPOSITIONS[leaky_relu] = _in_opmath(
    lambda x, negative_slope=0.01: prims.where(prims.gt(x, 0.0), x, prims.mul(x, float(negative_slope))))

elu = _activation("elu", lambda x, alpha=1.0: F.elu(x, alpha))
DECOMPOSITIONS[elu] = _in_opmath(
    lambda x, alpha=1.0: prims.where(prims.gt(x, 0.0), x, prims.mul(pm.expm1(x), float(alpha))))

hardsigmoid = _activation("hardsigmoid", F.hardsigmoid)
DECOMPOSITIONS[hardsigmoid] = _in_opmath(lambda x: prims.div(_relu6_of(prims.add(x, 3.0)), 6.0))

hardswish = _activation("hardswish", F.hardswish)
DECOMPOSITIONS[hardswish] = _in_opmath(
    lambda x: prims.div(prims.mul(x, _relu6_of(prims.add(x, 3.0))), 6.0))

mish = _activation("mish", F.mish)
DECOMPOSITIONS[mish] = _in_opmath(lambda x: prims.mul(x, prims.tanh(pm.log1p(prims.exp(x)))))

softplus = _activation("softplus", lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold))


@DECOMPOSITIONS.register(softplus)
@_in_opmath
def _softplus_decomp(x, beta=1.0, threshold=20.0):
    scaled = x if beta == 1 else prims.mul(x, float(beta))
    soft = pm.log1p(prims.exp(scaled))
    if beta != 1:
        soft = prims.div(soft, float(beta))
    return prims.where(prims.gt(scaled, float(threshold)), x, soft)
