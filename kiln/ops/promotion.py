"""torch's broadcasting and type-promotion rules, computed on metadata.

Promotion follows torch's three priority classes: tensors with dimensions, zero-dim tensors,
and Python scalars. A lower class can only raise the result's *category*
(bool < integer < floating < complex), never its width within a category.
"""
from __future__ import annotations

import enum

import torch

from kiln.meta.defaults import default_dtype
from kiln.meta.tensor_meta import TensorMeta, WrappedNumberMeta
from kiln.meta.symbolic import SymInt


class Promotion(enum.Enum):
    DEFAULT = "default"          # add, mul, where ...: the promoted type
    INT_TO_FLOAT = "int_to_float"  # exp, div ...: integers and bools become the default float
    ALWAYS_BOOL = "always_bool"   # comparisons: compute in the promoted type, return bool
    BOOL_TO_LONG = "bool_to_long"  # sum-like ops: bools count as int64


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _scalar_dtype(x) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int) or _is_symint(x):
        return torch.int64
    if isinstance(x, float):
        return default_dtype()
    if isinstance(x, complex):
        return torch.complex64 if default_dtype() == torch.float32 else torch.complex128
    raise TypeError(f"type promotion: {type(x).__name__} is not a number")


def _meta(x):
    m = getattr(x, "meta", x)
    return m if isinstance(m, TensorMeta) else None


def _promote_class(dtypes):
    out = None
    for d in dtypes:
        out = d if out is None else torch.promote_types(out, d)
    return out


def _to_complex(dtype):
    return {torch.float16: torch.complex32, torch.float32: torch.complex64,
            torch.float64: torch.complex128}.get(dtype, torch.complex64)


def _combine(higher, lower):
    """Fold a lower priority class into a higher one: only its category may win."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    ch, cl = _category(higher), _category(lower)
    if ch >= cl:
        return higher
    if cl == 3 and ch == 2:
        return _to_complex(higher)
    return lower


def result_type(*args) -> torch.dtype:
    dims, zeros, scalars = [], [], []
    numbers = False
    for a in args:
        if a is None:
            continue
        m = _meta(a)
        if type(m) is WrappedNumberMeta:  # a Python number held as a 0-d tensor
            scalars.append(_scalar_dtype(m.python_type(1)))
            numbers = True
        elif m is not None:
            (dims if m.ndim > 0 else zeros).append(m.dtype)
        elif isinstance(a, torch.Tensor):
            (dims if a.dim() > 0 else zeros).append(a.dtype)
        else:
            scalars.append(_scalar_dtype(a))
    if numbers and not dims and not zeros:  # Python arithmetic on numbers alone
        return _python_number_dtype(_promote_class(scalars))
    return _combine(_promote_class(dims), _combine(_promote_class(zeros), _promote_class(scalars)))


def _python_number_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of Python's own arithmetic in a category: floats are doubles, ints 64-bit
    (Python's are unbounded; a graph's wrap at 2**63), bools stay bools."""
    return (torch.bool, torch.int64, torch.float64, torch.complex128)[_category(dtype)]


def _numbers_only(args) -> bool:
    metas = [m for m in map(_meta, args) if m is not None]
    return bool(metas) and all(type(m) is WrappedNumberMeta for m in metas)


def promoted_dtypes(args, kind: Promotion) -> tuple[torch.dtype, torch.dtype]:
    """(compute dtype, result dtype) for an elementwise op under a promotion kind."""
    compute = result_type(*args)
    if kind == Promotion.INT_TO_FLOAT and _category(compute) < 2:
        # Python's ``3 / 2`` is a double; a tensor's is the default float
        compute = torch.float64 if _numbers_only(args) else default_dtype()
    if kind == Promotion.BOOL_TO_LONG and compute == torch.bool:
        compute = torch.int64
    result = torch.bool if kind == Promotion.ALWAYS_BOOL else compute
    return compute, result


def broadcast_shapes(*shapes) -> tuple:
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, size in enumerate(s):
            j = ndim - len(s) + i
            if size == 1:
                continue
            if out[j] == 1:
                out[j] = size
            elif out[j] != size:
                raise ValueError(f"shapes {[tuple(x) for x in shapes]} cannot be broadcast "
                                 f"(dimension {j}: {out[j]} vs {size})")
    return tuple(out)


def _is_symint(x) -> bool:
    return isinstance(x, SymInt)


def is_number(x) -> bool:
    """A Python scalar operand: bool, int, float, complex, or a symbolic size (an int)."""
    return isinstance(x, (bool, int, float, complex)) or _is_symint(x)


def scalar_for(value, dtype: torch.dtype):
    """A Python scalar cast to the Python type that matches dtype's category. A symbolic size
    stays symbolic for integer and floating categories (kernels read it as an argument and
    convert it); only a bool or complex use specializes it."""
    c = _category(dtype)
    if _is_symint(value) and c in (1, 2):
        return value
    if c == 0:
        return bool(value)
    if c == 1:
        return int(value)
    if c == 2:
        return float(value)
    return complex(value)


# torch's dtype names in its "not implemented for" messages
_KERNEL_DTYPE_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char",
                       torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
                       torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
                       torch.float64: "Double"}


def no_kernel(dtype: torch.dtype, kernel: str) -> NotImplementedError:
    """The error eager raises where an op has no kernel for an input dtype."""
    return NotImplementedError(f'[meta] "{kernel}" not implemented for '
                               f"'{_KERNEL_DTYPE_NAMES.get(dtype, dtype)}'")


def refuse_dtypes(rules, op, refuse, error):
    """Wrap op's meta rule so it raises ``error(dtype)`` for an input dtype ``refuse(dtype)``
    holds for: eager has no kernel there, and capture must refuse the call (it then runs
    eagerly and torch raises its own error) rather than compute something eager never returns."""
    rule = rules[op]

    def meta(x, *args, **kwargs):
        if isinstance(x, TensorMeta) and refuse(x.dtype):
            raise error(x.dtype)
        return rule(x, *args, **kwargs)
    rules[op] = meta
    return op


def is_bool(dtype) -> bool:
    return dtype == torch.bool


def not_float(dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex
