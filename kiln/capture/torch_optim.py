"""torch.optim's Python code in capture: ``kiln.compile(opt.step)``, PyTorch's "compiling the
optimizer" recipe.

kiln does not inline torch's Python code in general (torch functions are capture-table entries
or fallback nodes), so an optimizer was an opaque value and ``step`` ran eagerly. Here an
allow-list lets capture treat an ``Optimizer`` as a plain Python object (its ``param_groups``,
``state``, ``defaults`` and hook dicts tracked like any input containers, so state initialised
on the first step is a replayed write) and inline the Python code of the optimizers kiln has
tested against eager: SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam and RAdam, single-tensor
and foreach (tests/capture/test_optimizers_variants.py). Another optimizer's step (Rprop, ASGD,
LBFGS, ...) reaches a function of a module not listed here and breaks there cleanly, as before.
What stays a break inside the listed ones: RAdam's ``if rho_t > 5`` (the step count is a tensor
while compiling, ``_get_value``) and ``fused=True``'s ``torch._fused_adam_`` (a kernel writing
lists of tensors, not in the capture table); both run the step eagerly.

Two pieces of torch.optim are not inlined as written:

- ``_use_grad_for_differentiable`` calls ``torch._dynamo.graph_break()`` around the step so
  AOTAutograd sees an inference graph (pytorch#104053). kiln's tracer models grad mode itself,
  so the wrapper is the step under ``set_grad_enabled(self.defaults['differentiable'])``, the
  flag read (and guarded) through the optimizer's ``defaults``.
- ``torch._foreach_*`` ops (``capture/torch_optim_foreach.py``) are one op per list element.
"""
from __future__ import annotations

import types

import torch
import torch.optim.optimizer as _optimizer_module
import torch.utils._foreach_utils as _foreach_utils

from kiln.capture import controls
from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, Variable

# the modules whose functions (and the Optimizer methods they define) capture inlines: each one
# checked against eager in tests/capture/test_optimizer_step.py and test_optimizers_variants.py
INLINED_OPTIM_MODULES = frozenset({"torch.optim.optimizer", "torch.optim.sgd", "torch.optim.adam",
                                   "torch.optim.adamw", "torch.optim.rmsprop", "torch.optim.adagrad",
                                   "torch.optim.adamax", "torch.optim.nadam", "torch.optim.radam"})

# the inner function of ``_use_grad_for_differentiable`` (every optimizer's step is one)
_USE_GRAD_CODE = _optimizer_module._use_grad_for_differentiable(lambda self: None).__code__


# torch.utils._foreach_utils' lists of device types with foreach/fused kernels, which
# ``_default_to_fused_or_foreach`` reads when an optimizer's ``foreach`` is None (the default):
# fixed for the process (the privateuse1 backend's name is set once, before any optimizer)
_PROCESS_CONSTANTS = frozenset({_foreach_utils._get_fused_kernels_supported_devices,
                                _foreach_utils._get_foreach_kernels_supported_devices})


def is_optimizer(value) -> bool:
    """An optimizer instance, read as a plain Python object (``values_python.is_user_object``)."""
    return isinstance(value, torch.optim.Optimizer)


def _undo_dynamo_patch(fn):
    """Once Dynamo has run in the process (``TorchPatcher.patch``) every optimizer class's
    ``_init_group`` is wrapped in ``torch._dynamo.disable``: Dynamo runs it for real through its
    own OptimizerVariable. That is Dynamo's mechanism, not the user's wish, so kiln reads the
    function it wraps; anything else disabled stays a break."""
    wrapped = getattr(fn, "__wrapped__", None)
    if controls.is_disabled(fn) and isinstance(wrapped, types.FunctionType) \
            and wrapped.__name__ == "_init_group" \
            and str(getattr(fn, "_torchdynamo_disable_msg", "")).endswith("_init_group not supported"):
        return wrapped
    return fn


def is_inlined_optim_code(fn) -> bool:
    """A Python function of torch.optim that capture inlines as user code (or, for the device
    lists it reads, calls at trace time)."""
    fn = _undo_dynamo_patch(fn)
    return isinstance(fn, types.FunctionType) and (fn.__module__ in INLINED_OPTIM_MODULES
                                                   or fn in _PROCESS_CONSTANTS) \
        and not controls.is_disabled(fn)


def optim_call(tx, fn, source, self_var=None):
    """The Variable that calls torch.optim's ``fn`` (a method when ``self_var`` is its optimizer):
    the step wrapper as the step under its grad mode, anything else inlined."""
    from kiln.capture.values_callables import FunctionVariable
    fn = _undo_dynamo_patch(fn)
    if fn in _PROCESS_CONSTANTS:
        return _ProcessConstant(fn)
    if fn.__code__ is _USE_GRAD_CODE:
        wrapped = getattr(fn, "__wrapped__", None)
        if not isinstance(wrapped, types.FunctionType):
            raise Unsupported(f"{fn.__qualname__}: the optimizer step wrapper without a Python step")
        return _StepUnderGradMode(FunctionVariable(wrapped, source=tx.attr_source(source, "__wrapped__")),
                                  self_var)
    return FunctionVariable(fn, source=source, self_var=self_var)


def function_attribute(tx, fn, source, name):
    """An attribute of an inlined torch.optim function: ``__get__`` binds it (an lr scheduler's
    step wrapper calls ``func.__get__(opt, opt.__class__)``), the rest are a function's."""
    from kiln.capture.values_callables import FunctionVariable
    if name == "__get__":
        return _Binder(fn, source)
    return FunctionVariable(fn, source=source).getattr(tx, name)


class _Binder(Variable):
    """``fn.__get__(obj, cls)``: the bound method, as ``optim_call`` calls it."""

    def __init__(self, fn, source):
        self.fn, self.source = fn, source

    def call(self, tx, args, kwargs):
        from kiln.capture.values_python import ObjectVariable
        if kwargs or not 1 <= len(args) <= 2 or not isinstance(args[0], ObjectVariable) \
                or not issubclass(args[0].cls, torch.optim.Optimizer):
            raise Unsupported(f"{self.fn.__qualname__}.__get__ with these arguments")
        return optim_call(tx, self.fn, self.source, self_var=args[0])


class _ProcessConstant(Variable):
    """A function of no arguments whose answer is fixed for the process: called at trace time."""

    def __init__(self, fn):
        self.fn = fn

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"{self.fn.__qualname__} called with arguments")
        return tx.wrap_constant(self.fn())


class _StepUnderGradMode(Variable):
    """``_use_grad_for_differentiable(step)``: eager sets grad mode to
    ``self.defaults['differentiable']`` around the step and restores it after (its two dynamo
    graph breaks only shape AOTAutograd's graph, see the module docstring)."""

    def __init__(self, step, self_var):
        self.step, self.self_var = step, self_var

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        from kiln.capture.values_python import GradModeVariable
        if self.self_var is not None:
            args = [self.self_var] + list(args)
        if not args:
            raise Unsupported("the optimizer step wrapper called without its optimizer")
        owner = args[0]
        flag = tx.getitem(owner.getattr(tx, "defaults"), ConstantVariable("differentiable")).as_python()
        if not isinstance(flag, bool):
            raise Unsupported(f"optimizer defaults['differentiable'] is {flag!r}, not a bool")
        exit_, _ = GradModeVariable(flag).enter(tx)
        try:
            return self.step.call(tx, args, kwargs)
        finally:
            exit_.call(tx, [], {})

    def __repr__(self):
        return f"OptimizerStep({self.step})"


def input_grad(tx, var):
    """``p.grad`` of an input tensor (the optimizer reads each parameter's): the real gradient,
    a graph input reached through ``<p's source>.grad`` and guarded like one (its being None
    included). A tensor made in the trace has no gradient capture could know of."""
    entry = next(((s, t) for v, s, t in tx._tensor_inputs.values() if v is var), None)
    if entry is None:
        raise Unsupported("Tensor.grad of a tensor made in the compiled code is not supported")
    source, real = entry
    return tx.wrap(real.grad, tx.attr_source(source, "grad"))
