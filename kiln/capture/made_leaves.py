"""``t.requires_grad_()`` (or ``t.requires_grad = True``) on a tensor the traced code made:
transformers' MRA returns ``torch.zeros_like(query).requires_grad_()`` from its attention when
its CUDA kernel is missing.

Eager makes ``t`` a leaf that requires grad. With grad mode off, that changes ``t`` alone: ops
on it record nothing, so what they compute is the same either way. Capture keeps that case,
marking the tracker (``made_leaf``) instead of the graph: ``t.requires_grad`` / ``is_leaf`` /
``grad`` / ``grad_fn`` read as eager's, and where ``t`` leaves the trace (returned, or stored
into Python state) the output is made a leaf that requires grad again after the graph runs
(rebuild.py's ``leaf`` spec). Live at a graph break, it would reach the resume function as a
plain input: the rest of the frame runs eagerly.

Refused (a break, so eager runs it and raises what it raises): grad mode on at the call (ops on
``t`` would record a graph whose gradient for ``t`` the compiled backward does not compute),
a marked tensor read by an op with grad mode on later, a tensor from the inputs or a view of
another tensor (its flag belongs to autograd's view tracking), a non-floating dtype, and
``requires_grad_(False)`` on a tensor that requires grad through the graph (a non-leaf).
"""
from __future__ import annotations

from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.values import ConstantVariable, ListVariable, TensorVariable, TupleVariable, Variable

_LEAF_ATTRIBUTES = {"requires_grad": True, "is_leaf": True, "grad": None, "grad_fn": None}


class RequiresGradMethod(Variable):
    """``t.requires_grad_``, bound."""

    def __init__(self, var):
        self.var = var

    def call(self, tx, args, kwargs):
        if len(args) > 1 or set(kwargs) - {"requires_grad"} or args and kwargs:
            raise Unsupported("Tensor.requires_grad_ takes one argument, requires_grad")
        flag = (args or list(kwargs.values()) or [ConstantVariable(True)])[0]
        return set_requires_grad(tx, self.var, flag)


def set_requires_grad(tx, var: TensorVariable, flag: Variable) -> TensorVariable:
    """``var.requires_grad_(flag)``: ``var`` marked, or Unsupported (the module docstring)."""
    if not isinstance(flag, ConstantVariable) or type(flag.value) is not bool:
        raise Unsupported(f"Tensor.requires_grad_({flag}): not a constant bool")
    want, meta = flag.value, var.proxy.meta
    if want == (var.made_leaf or meta.requires_grad):
        return var  # no change, as eager
    if not want:
        if not var.made_leaf:  # requires grad through the graph: eager refuses a non-leaf
            raise Unsupported("Tensor.requires_grad_(False) on a tensor computed from ones that require grad")
        var.made_leaf = False
        return var
    if var.source is not None or var.alias is not None:
        raise Unsupported("Tensor.requires_grad_() on an input or a view: its flag is autograd's state "
                          "outside the compiled function")
    if not (meta.dtype.is_floating_point or meta.dtype.is_complex):
        raise EagerRaises(f"Tensor.requires_grad_() on a {meta.dtype} tensor (eager raises)")
    if tx.grad_enabled:
        raise Unsupported("Tensor.requires_grad_() with grad mode on: the compiled graph would not "
                          "compute the gradient of the new leaf")
    var.made_leaf = True
    tx.made_leaves = True
    return var


def leaf_attribute(var, name):
    """``t.requires_grad`` and friends of a marked tensor, as eager's; None for other names."""
    if var.made_leaf and name in _LEAF_ATTRIBUTES:
        return ConstantVariable(_LEAF_ATTRIBUTES[name])
    return None


def refuse_grad_mode_use(tx, args, kwargs, name):
    """An op with grad mode on reading a marked tensor: eager would record it (the result
    requires grad through the new leaf)."""
    if not tx.grad_enabled:
        return
    for v in (*args, *kwargs.values()):
        items = v.items if isinstance(v, (TupleVariable, ListVariable)) else (v,)
        if any(isinstance(x, TensorVariable) and x.made_leaf for x in items):
            raise Unsupported(f"{name} with grad mode on reads a tensor made to require grad inside "
                              "the compiled function")
