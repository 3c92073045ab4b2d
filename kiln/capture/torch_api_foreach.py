"""``torch._foreach_*``: one op per list element, through the capture table's own entries.

torch.optim's foreach paths (the default on CUDA) update every parameter with one
``_foreach_*`` kernel per step of the formula. In a graph they are per-tensor elementwise ops
that the fusion scheduler groups again, as Inductor lowers them (foreach nodes of pointwise
ops). The forms here are the ones torch.optim's SGD and Adam/AdamW call:

- ``_foreach_op(list, list | scalar | scalar list | tensor)`` and its in-place ``_foreach_op_``
  (a write into each element, returning None as eager does);
- ``_foreach_pow(scalar, list)``: a Python number raised to each tensor;
- ``_foreach_addcmul_/addcdiv_(self, t1, t2, scalars)`` where ``scalars`` may be a 1-d tensor,
  one value per element (Adam's stacked step sizes while compiling), or ``value=`` a number or
  0-d tensor for all (RMSprop's ``value=-lr`` with a tensor lr).

A list argument of another length than the first is eager's error: a refusal here, so eager
runs and raises it.
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.torch_api_inplace import Writes
from kiln.graph import Proxy
from kiln.ops import core

# foreach names (without ``_foreach_``) and whether eager has the in-place form too
_UNARY = ("neg", "sqrt", "reciprocal", "abs", "exp", "log", "sign")
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "clamp_min", "clamp_max")
_TERNARY = ("addcmul", "addcdiv", "lerp")


def _lists(args):
    return [a for a in args if isinstance(a, (list, tuple))]


def _element(arg, i, per_element_tensor):
    """Argument ``arg`` as the i-th element's call sees it."""
    if isinstance(arg, (list, tuple)):
        return arg[i]
    if per_element_tensor and isinstance(arg, Proxy):
        if arg.ndim != 1 or arg.shape[0] <= i:
            raise Unsupported("a foreach op's scalars tensor must be 1-d, one value per element")
        return core.select(arg, 0, i)
    return arg


def _per_element(name, method, first_is_scalar_ok=False):
    """The functional foreach adapter: ``[method(self[i], *args_i) for i]``."""
    per_element_tensor = name in ("addcmul", "addcdiv")  # their ``scalars`` tensor overload

    def adapter(self, *args, **kwargs):
        if not isinstance(self, (list, tuple)):
            if first_is_scalar_ok and isinstance(self, (int, float)) and len(args) == 1 \
                    and isinstance(args[0], (list, tuple)):
                return [method(self, t) for t in args[0]]  # _foreach_pow(scalar, tensors)
            raise Unsupported(f"_foreach_{name}: the first argument is not a list of tensors")
        n = len(self)
        if any(len(a) != n for a in _lists(args)):
            raise Unsupported(f"_foreach_{name}: lists of different lengths (eager raises)")
        if "value" in kwargs and per_element_tensor \
                and not (isinstance(kwargs["value"], Proxy) and kwargs["value"].ndim == 0):
            # ``value=`` is the Scalar overload's, one number for all; a 0-d tensor there is
            # that number (RMSprop's ``value=-lr`` with a tensor lr), passed to each call as is
            kwargs = dict(kwargs)
            value = kwargs.pop("value")
            args = args + (value,)
        out = []
        for i in range(n):
            if not isinstance(self[i], Proxy):
                raise Unsupported(f"_foreach_{name}: an element that is not a tensor")
            call_args = [_element(a, i, per_element_tensor and j == 2) for j, a in enumerate(args)]
            if per_element_tensor and len(call_args) == 3:  # scalars: value=
                out.append(method(self[i], *call_args[:2], value=call_args[2], **kwargs))
            else:
                out.append(method(self[i], *call_args, **kwargs))
        return out
    adapter.__name__ = f"_foreach_{name}"
    return adapter


def _in_place(name, functional):
    """``_foreach_op_``: each element written with its new value; returns None."""
    def adapter(self, *args, **kwargs):
        new = functional(self, *args, **kwargs)
        return Writes(list(zip(self, new)), None)
    adapter.__name__ = f"_foreach_{name}_"
    return adapter


def build_table(tensor_methods, torch_functions) -> dict:
    """``{torch._foreach_x: adapter}`` for the forms whose per-tensor op the tables hold."""
    table = {}
    for name in _UNARY + _BINARY + _TERNARY:
        method = tensor_methods.get(name)
        if method is None:
            continue
        functional = _per_element(name, method, first_is_scalar_ok=name == "pow")
        if name == "pow":  # a scalar base goes through torch.pow, which takes a number first
            functional = _per_element(name, _pow(method, torch_functions[torch.pow]), True)
        if hasattr(torch, f"_foreach_{name}"):
            table[getattr(torch, f"_foreach_{name}")] = functional
        if hasattr(torch, f"_foreach_{name}_"):
            table[getattr(torch, f"_foreach_{name}_")] = _in_place(name, functional)
    return table


def _pow(method, function):
    def pow_(base, exponent):
        return method(base, exponent) if isinstance(base, Proxy) else function(base, exponent)
    return pow_
