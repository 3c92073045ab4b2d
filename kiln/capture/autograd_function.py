"""``MyFunction.apply(...)`` of a user's ``torch.autograd.Function`` during capture.

``forward`` is always inlined under no_grad, as eager runs it. Where no gradient can flow
(grad disabled, as in every inference run, or no tensor argument requiring grad) that is all:
the ctx records what it is told and nothing reads it. BLOOM's ``GeLUFunction`` broke every
layer's graph in two before.

Where a gradient can flow (training), the ctx keeps what ``backward`` will read: the values of
``save_for_backward``, the other attributes set on it (not tensors: eager would keep those
without its saved-tensor checks; a tensor that is also saved reads as the saved one), the
outputs marked non-differentiable and ``set_materialize_grads``. ``backward`` is then traced
into a graph of its own (``autograd_function_backward.py``; outside any torch.autocast region,
as eager's engine runs it at ``backward()``: a ``custom_bwd`` backward re-enters the
forward's), and one ``core.autograd_function`` node (kiln/ops/core_autograd_function.py) takes
the forward's outputs: its VJP rule is that graph, so kiln's autograd differentiates the region
with the user's backward, never with the forward's ops. A function written the
``setup_context`` way runs ``forward`` without a ctx, then ``setup_context(ctx, inputs,
output)``.

What cannot be captured that way is a graph break at the ``apply`` call naming the function
and why, and eager runs ``apply`` (and its backward): a break inside ``forward`` or ``backward``
(data-dependent Python, an unsupported op), ``mark_dirty`` (an in-place forward), tensors
stored on ctx without being saved, a backward that writes Python state, writes into a saved
tensor or reads a tensor it was not handed (a module's weight, a closure's tensor), gradients
eager would refuse (their count, a shape the input does not broadcast to, a non-tensor),
``set_materialize_grads(False)`` with several differentiable outputs (which gradients are None
is known only when backward runs). An output that is an input or a view of one is a view of
that input in eager: the region's result is linked to the input's memory with an uncertain
step (capture/mutation.py), so an in-place write to either makes reading the other a graph
break (eager raises there).

Guards: ``forward``, ``backward`` and ``setup_context`` are read through the class's source,
so replacing one recompiles.
"""
from __future__ import annotations

import inspect

import torch

from kiln.capture.autograd_function_backward import capture_backward, is_tensor, not_captured, overrides
from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, TupleVariable, Variable
from kiln.capture.values_callables import FunctionVariable

APPLY = torch.autograd.Function.apply.__func__


class FunctionCtxVariable(Variable):
    """The ctx of one ``apply``. ``training``: whether what it records will be read by a traced
    backward (otherwise ``mark_dirty`` is harmless too: no backward ever runs)."""

    _RESERVED = {"saved_tensors", "saved_variables", "needs_input_grad", "materialize_grads",
                 "to_save", "non_differentiable", "dirty_tensors"}

    def __init__(self, name: str, needs_input_grad: tuple, training: bool):
        self.name = name
        self.needs_input_grad = needs_input_grad
        self.training = training
        self.saved: list | None = None      # Variables given to save_for_backward (None kept)
        self.attrs: dict[str, Variable] = {}
        self.non_differentiable: list = []
        self.materialize = True
        self.in_backward = False
        self.saved_in_backward: list | None = None  # what ctx.saved_tensors reads in backward
        self.backward_values: dict = {}     # id(forward Variable) -> its backward placeholder

    def python_type(self):
        return torch.autograd.function.FunctionCtx

    def getattr(self, tx, name):
        if name in _CTX_METHODS:
            return _CtxMethod(self, name)
        if name == "needs_input_grad":
            return TupleVariable([ConstantVariable(b) for b in self.needs_input_grad])
        if name in ("saved_tensors", "saved_variables"):  # empty until forward returns, as in eager
            return TupleVariable(list(self.saved_in_backward) if self.in_backward else [])
        if name == "materialize_grads":
            return ConstantVariable(self.materialize)
        if name in self.attrs:
            value = self.attrs[name]
            return self.backward_values.get(id(value), value) if self.in_backward else value
        raise Unsupported(f"{self.name}: ctx has no attribute {name!r} (or kiln does not model it)")

    def setattr(self, tx, name, value):
        if self.in_backward:
            raise Unsupported(f"{self.name}.backward sets ctx.{name}: Python state written by a "
                              "backward is not captured")
        if name in self._RESERVED:
            raise Unsupported(f"{self.name}: assigning ctx.{name} is not supported")
        self.attrs[name] = value

    def __repr__(self):
        return f"FunctionCtx({self.name})"


class _CtxMethod(Variable):
    def __init__(self, ctx: FunctionCtxVariable, name: str):
        self.ctx, self.name = ctx, name

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        ctx = self.ctx
        if kwargs or ctx.in_backward:
            raise Unsupported(f"{ctx.name}: ctx.{self.name}(...) {'in backward' if ctx.in_backward else 'with keywords'}")
        _CTX_METHODS[self.name](ctx, list(args))
        return ConstantVariable(None)


def _save_for_backward(ctx, args):
    for a in args:
        if not (is_tensor(a) or (isinstance(a, ConstantVariable) and a.value is None)):
            raise Unsupported(f"{ctx.name}: save_for_backward of {a} (eager takes tensors or None)")
    ctx.saved = args


def _mark_dirty(ctx, args):
    if ctx.training:
        raise Unsupported("ctx.mark_dirty (an in-place forward) with grad enabled")


def _mark_non_differentiable(ctx, args):
    if not all(is_tensor(a) for a in args):
        raise Unsupported(f"{ctx.name}: mark_non_differentiable of a non-tensor")
    ctx.non_differentiable += args


def _set_materialize_grads(ctx, args):
    if len(args) != 1 or not isinstance(args[0], ConstantVariable):
        raise Unsupported(f"{ctx.name}: set_materialize_grads takes one constant")
    ctx.materialize = bool(args[0].value)


_CTX_METHODS = {
    "save_for_backward": _save_for_backward,
    "save_for_forward": lambda ctx, args: None,  # forward-mode AD: never used by a backward
    "mark_dirty": _mark_dirty,
    "mark_non_differentiable": _mark_non_differentiable,
    "set_materialize_grads": _set_materialize_grads,
}


class FunctionApplyVariable(Variable):
    """``cls.apply`` of a ``torch.autograd.Function`` subclass ``cls``; ``source``: the class's."""

    def __init__(self, cls, cls_source=None, tx=None):
        self.cls = cls
        self.cls_source = cls_source
        # rebuilt at a graph break as ``cls.apply`` (the class itself would be instantiated)
        self.source = tx.attr_source(cls_source, "apply") if cls_source is not None and tx else None

    def as_python(self):
        return self.cls.apply

    @property
    def name(self) -> str:
        """The class's name in messages and graphs (without a defining function's ``<locals>``)."""
        return self.cls.__qualname__.rsplit("<locals>.", 1)[-1]

    def method(self, tx, name):
        """``cls.<name>`` as traced code: through the class's source (guarded: a replaced
        method recompiles), else the function itself."""
        fn = getattr(self.cls, name)
        src = tx.attr_source(self.cls_source, name) if self.cls_source is not None else None
        return tx.wrap(fn, src) if src is not None else FunctionVariable(fn)

    def call(self, tx, args, kwargs):
        cls, name = self.cls, self.name
        setup_style = overrides(cls, "setup_context")
        args = _bind(cls, name, list(args), kwargs, setup_style)
        needs = tuple(is_tensor(a) and a.proxy.meta.requires_grad for a in args)
        training = tx.grad_enabled and any(needs)
        ctx = FunctionCtxVariable(name, needs, training)
        out = self._forward(tx, ctx, args, setup_style)
        return capture_backward(tx, self, ctx, args, out) if training else out

    def _forward(self, tx, ctx, args, setup_style):
        prev, tx.grad_enabled = tx.grad_enabled, False  # eager runs forward under no_grad
        part = "forward"
        try:
            if not setup_style:
                return self.method(tx, "forward").call(tx, [ctx, *args], {})
            out = self.method(tx, "forward").call(tx, list(args), {})
            if ctx.training:
                part = "setup_context"
                self.method(tx, "setup_context").call(tx, [ctx, TupleVariable(list(args)), out], {})
            return out
        except Unsupported as e:
            raise not_captured(self.name, part, e) from e
        finally:
            tx.grad_enabled = prev

    def __repr__(self):
        return f"FunctionApply({self.cls.__qualname__})"


def _bind(cls, name, args, kwargs, setup_style):
    """The arguments as ``apply`` passes them to forward: positional; with ``setup_context``,
    keywords and defaults bound by forward's signature, as torch does (so ``needs_input_grad``
    and the gradients backward returns count the defaults too)."""
    if not setup_style:
        if kwargs:
            raise Unsupported(f"{name}.apply with keyword arguments is not supported")
        return args
    try:
        bound = inspect.signature(cls.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"{name}.apply: {e}") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise Unsupported(f"{name}.apply: keyword-only arguments are not supported")
    return [a if isinstance(a, Variable) else ConstantVariable(a) for a in bound.args]

