"""``torch.op(..., out=t)`` for every capture-table entry: the op's value, written into ``t``.

Adapters compute values; an ``out=`` tensor is a write, which capture already models for
in-place ops (``Writes``, functionalized by ``mutation.py``). So ``call_adapter`` takes ``out``
away from the adapter and turns its result into a write of ``t`` that returns ``t`` (torch.optim's
single-tensor amsgrad step is ``torch.maximum(max_sq, sq, out=max_sq)``).

Only the form whose eager answer is plainly "compute, then copy" is captured: one tensor ``out``
of the result's shape and dtype. Eager resizes an ``out`` of another shape and casts (or refuses)
another dtype, and creation ops take their dtype from ``out``; those stay with eager (a refusal,
so eager runs the call and gives its answer or its error), as is an ``out`` sharing memory with
another argument unless it is that very tensor (eager refuses a partial overlap). Under grad mode eager refuses ``out=``
when an argument requires grad; kiln refuses it too rather than drop the gradient.
"""
from __future__ import annotations

from kiln.capture import mutation
from kiln.capture.errors import Unsupported
from kiln.capture.torch_api_inplace import Writes
from kiln.graph import Proxy


def split_out(kwargs: dict):
    """``(kwargs without out, out's Variable)`` when ``out`` is one tensor, else ``(kwargs, None)``
    (an ``out`` tuple, of ``torch.max(x, 0, out=(v, i))``, stays with the adapter, which refuses)."""
    from kiln.capture.values import TensorVariable
    out = kwargs.get("out")
    if not isinstance(out, TensorVariable):
        return kwargs, None
    return {k: v for k, v in kwargs.items() if k != "out"}, out


def refuse_overlap(tx, out_var, args, kwargs, name: str):
    """Eager refuses an ``out`` that partly overlaps an input; kiln's functional write would not
    notice, so an input sharing out's memory must be out itself (``maximum(a, b, out=a)``)."""
    from kiln.capture.values import TensorVariable
    storage = mutation.storage_of(tx, out_var).storage
    for v in [*args, *kwargs.values()]:
        if isinstance(v, TensorVariable) and v is not out_var \
                and mutation.storage_of(tx, v).storage is storage:
            raise Unsupported(f"{name}(out=...): out shares memory with another argument")


def write_into(result, out: Proxy, grad_enabled: bool, name: str) -> Writes:
    """The adapter's ``result`` as a write of the ``out`` tensor, which the call returns."""
    if not isinstance(result, Proxy):
        raise Unsupported(f"{name}(out=...): the op's result is not one tensor")
    if tuple(result.shape) != tuple(out.shape):
        raise Unsupported(f"{name}(out=...): out's shape {list(out.shape)} is not the result's "
                          f"{list(result.shape)} (eager resizes out)")
    if result.dtype != out.dtype:
        raise Unsupported(f"{name}(out=...): out's dtype {out.dtype} is not the result's "
                          f"{result.dtype} (eager casts out or refuses)")
    if grad_enabled and (result.meta.requires_grad or out.meta.requires_grad):
        raise Unsupported(f"{name}(out=...) with an argument that requires grad (eager refuses: "
                          "out= arguments don't support automatic differentiation)")
    return Writes([(out, result)], out)
