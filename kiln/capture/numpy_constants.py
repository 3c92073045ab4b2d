"""A NumPy ufunc called on Python numbers during capture (CTRL's ``np.sqrt(d_model)``): pure
arithmetic on constants, computed now. The ufunc is guarded by identity, its arguments are
constants guarded where they were read, and a NumPy scalar result becomes the Python number
torch would read it as (a 0-d result only; an array stays a break)."""
from __future__ import annotations

import sys

from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable


def is_ufunc(value) -> bool:
    np = sys.modules.get("numpy")  # a ufunc exists only once NumPy is imported
    return np is not None and type(value) is np.ufunc


def call_ufunc(tx, var, args, kwargs):
    np = sys.modules["numpy"]
    values = []
    for a in (*args, *kwargs.values()):
        v = a.as_python() if isinstance(a, ConstantVariable) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Unsupported(f"NumPy's {var.value.__name__} of {a}: only Python numbers are computed at capture")
        values.append(v)
    out = var.value(*values[:len(args)], **dict(zip(kwargs, values[len(args):])))
    if not isinstance(out, np.generic):
        raise Unsupported(f"NumPy's {var.value.__name__} gave {type(out).__name__}, not a scalar")
    if var.source is not None:
        tx.guards.identity(var.source, var.value)
    return ConstantVariable(out.item())
