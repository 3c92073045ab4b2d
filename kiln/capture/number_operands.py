"""torch's arithmetic functions called with Python numbers where their tensor goes:
``torch.div(seq_len, window, rounding_mode="trunc")`` (transformers' Longformer), ``torch.add(n, 1)``.

torch's argument parser takes a number for the ``input`` tensor of a few functions only (its
``should_allow_numbers_as_tensors`` list, python_arg_parser.cpp) and wraps it into a 0-d tensor;
every other function raises ``TypeError`` on a number there, which capture leaves to eager.
With only numbers, the op meets no tensor, so the capture table's adapters (whose meta rules
need a tensor operand) cannot take the call. Capture does what eager does: constants (sizes
specialized and guarded where they were read, Python values guarded at their source) are
computed at trace time into a graph constant, the 0-d tensor eager returns; a symbolic size is
first made the 0-d int64 tensor torch would wrap it into.
"""
from __future__ import annotations

import torch

from kiln.capture import torch_api
from kiln.capture.torch_ops import _on_numbers
from kiln.capture.values import ConstantVariable, TensorVariable
from kiln.meta.symbolic import SymInt

# torch's list (python_arg_parser.cpp), as torch-level functions; Tensor methods have a tensor self
NUMBERS_AS_TENSORS = frozenset({
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div, torch.divide,
    torch.true_divide, torch.floor_divide,
})


def _number(v) -> bool:
    return isinstance(v, ConstantVariable) and isinstance(v.value, (bool, int, float, SymInt))


def call_on_numbers(tx, fn, args, kwargs, name):
    """The call's result when ``fn`` takes its tensor operands as numbers here, else None (the
    capture table's adapter runs as usual)."""
    operands = list(args[:2]) + [kwargs[k] for k in ("input", "other") if k in kwargs]
    if fn not in NUMBERS_AS_TENSORS or not operands or not all(_number(v) for v in operands) \
            or any(isinstance(v, TensorVariable) for v in (*args, *kwargs.values())):
        return None
    if not any(isinstance(v.value, SymInt) for v in operands):
        return tx.call_adapter(_on_numbers(fn), args, kwargs, name)
    first = args[0] if args else kwargs["input"]
    value = first.value
    dtype = torch.bool if isinstance(value, bool) else \
        torch.get_default_dtype() if isinstance(value, float) else torch.int64
    wrapped = tx.call_adapter(torch_api.TORCH_FUNCTIONS[torch.full], [ConstantVariable(()), first],
                              {"dtype": ConstantVariable(dtype), "device": ConstantVariable("cpu")}, name)
    if args:
        args = [wrapped, *args[1:]]
    else:
        kwargs = dict(kwargs, input=wrapped)
    return tx.call_adapter(torch_api.TORCH_FUNCTIONS[fn], args, kwargs, name)
