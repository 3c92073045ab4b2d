"""``MyFunction.apply(...)`` of a user's ``torch.autograd.Function`` during capture.

With grad disabled (``torch.no_grad()``, ``inference_mode``: every inference run), ``apply``
only runs ``forward``; its backward can never be called. Capture inlines the forward then,
with a ctx on which ``save_for_backward``, ``mark_dirty``, ``mark_non_differentiable`` and
``set_materialize_grads`` record nothing and ``needs_input_grad`` is all False, so the
function's ops join the graph: BLOOM's ``GeLUFunction`` broke every layer's graph in two.
A function written the ``setup_context`` way has a forward without ctx, called as it is.

With grad enabled the custom backward would have to be captured too: that stays a graph break,
which names the function.
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, TupleVariable, Variable
from kiln.capture.values_callables import FunctionVariable

APPLY = torch.autograd.Function.apply.__func__


def _own_setup_context(cls) -> bool:
    base = torch.autograd.Function.setup_context
    return getattr(cls.setup_context, "__func__", cls.setup_context) is not getattr(base, "__func__", base)


class InferenceCtx:
    """The ctx of a forward run with grad disabled: nothing it saves or marks is ever read."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


class FunctionApplyVariable(Variable):
    """``cls.apply`` of a ``torch.autograd.Function`` subclass ``cls``; ``source``: the class's."""

    def __init__(self, cls, cls_source=None, tx=None):
        self.cls = cls
        self.cls_source = cls_source
        # rebuilt at a graph break as ``cls.apply`` (the class itself would be instantiated)
        self.source = tx.attr_source(cls_source, "apply") if cls_source is not None and tx else None

    def as_python(self):
        return self.cls.apply

    def call(self, tx, args, kwargs):
        cls = self.cls
        if tx.grad_enabled:
            raise Unsupported(f"{cls.__qualname__}.apply with grad enabled: the backward of a custom "
                              f"torch.autograd.Function is not captured (it runs eagerly)")
        src = tx.attr_source(self.cls_source, "forward") if self.cls_source is not None else None
        # through its source, the forward is guarded: a replaced forward recompiles
        forward = tx.wrap(cls.forward, src) if src is not None else FunctionVariable(cls.forward)
        if _own_setup_context(cls):
            return forward.call(tx, list(args), kwargs)
        from kiln.capture.values_python import ObjectVariable
        flags = TupleVariable([ConstantVariable(False) for _ in args])
        ctx = ObjectVariable(InferenceCtx, attrs={"needs_input_grad": flags})
        return forward.call(tx, [ctx, *args], kwargs)

    def __repr__(self):
        return f"FunctionApply({self.cls.__qualname__})"
