"""Value trackers of the code the traced program calls into (values.py has the data ones).

- ``ModuleVariable``: an ``nn.Module`` (calling it inlines its ``forward``, with its hooks);
- ``FunctionVariable``: a user Python function (calling it inlines its bytecode);
- ``BuiltinVariable`` / ``TorchFunctionVariable``: callables handled by a table (builtins.py,
  the capture table of torch_api.py), else a fallback node or torch's own Python inlined;
- ``PythonModuleVariable``: a Python module the code reads functions from (``torch``, ``math``).

They build on values.py's trackers; nothing there needs these.
"""
from __future__ import annotations

import collections
import types

import torch

from kiln.capture import controls, sized_later, torch_api, torch_optim
from kiln.capture.errors import Unsupported
from kiln.capture.dict_keys import dict_key
from kiln.capture.fallback import fallback_adapter
from kiln.capture import module_walks
from kiln.capture.guards import AttrSource, ItemSource
from kiln.capture.number_operands import call_on_numbers
from kiln.capture.values import (ConstantVariable, DictVariable, ListVariable, TensorVariable,
                                 TupleVariable, Variable, is_constant)


class ModuleVariable(Variable):
    # A module made during the trace (capture/module_new.py) is a real object private to the
    # call: no source, no guards, read and written for real.
    local = False

    def __init__(self, module, source):
        self.module = module
        self.source = source

    def _guard(self, tx, check: str):
        tx.guards.add(self.source, check)

    def _child(self, tx, value, source):
        """A value held by this module (a submodule, an item), reached through ``source``."""
        return tx.wrap(value, source)

    def _method(self, tx, name, fn):
        """``module.name`` for a method ``fn`` of its class: inlined when called."""
        method = FunctionVariable(fn, self_var=self)
        method.method_name = name
        return method

    def python_type(self):
        return type(self.module)

    def truth(self, tx):
        return True

    def getattr(self, tx, name):
        written = tx.side_effects.load_attr(self, name)  # set earlier in this trace
        if written is not None:
            return written
        if isinstance(self.module, torch.nn.ModuleDict) and name in ("items", "keys", "values"):
            return _Thunk(lambda: self.module_dict_method(tx, name))
        if name in ("children", "named_children") and _plain_module_method(self.module, name):
            return _Thunk(lambda: self.direct_children(tx, named=name == "named_children"))
        if name in module_walks.WALKS and self.source is not None and _plain_module_method(self.module, name):
            return module_walks.ModuleWalkVariable(self, name)
        from kiln.capture.values_python import user_class_attribute
        out = user_class_attribute(tx, self, name)  # properties, static/class methods
        if out is not None:
            return out
        try:
            value = getattr(self.module, name)
        except AttributeError as e:
            raise Unsupported(str(e)) from None
        if isinstance(value, types.MethodType) and value.__self__ is self.module:
            return self._method(tx, name, value.__func__)
        return self._child(tx, value, tx.attr_source(self.source, name))

    def _children(self, tx):
        if not isinstance(self.module, (torch.nn.ModuleList, torch.nn.Sequential)):
            raise Unsupported(f"iterating over {type(self.module).__name__} is not supported")
        children = list(self.module)
        self._guard(tx, f"len({{}}) == {len(children)}")
        return children

    def _dict_keys(self, tx):
        keys = list(self.module.keys())
        self._guard(tx, f"list({{}}.keys()) == {keys!r}")
        return keys

    def iterate(self, tx):
        if isinstance(self.module, torch.nn.ModuleDict):  # iterating a ModuleDict gives its keys
            return [ConstantVariable(k) for k in self._dict_keys(tx)]
        return [self._child(tx, m, ItemSource(self.source, i)) for i, m in enumerate(self._children(tx))]

    def direct_children(self, tx, named: bool):
        """``children()`` / ``named_children()`` (timm's stages loop ``for b in
        self.children()``), as a tuple of trackers: torch's generator, computed now, guarded on
        the names of the module's submodules (a None entry is skipped, as torch skips it)."""
        modules = self.module._modules
        keys = list(modules.keys())
        self._guard(tx, f"list({{}}._modules.keys()) == {keys!r}")
        holder = tx.attr_source(self.source, "_modules")
        out, seen = [], set()
        for k in keys:
            m = modules[k]
            if m is None or id(m) in seen:  # torch yields each submodule once
                continue
            seen.add(id(m))
            child = self._child(tx, m, ItemSource(holder, k))
            out.append(TupleVariable([ConstantVariable(k), child]) if named else child)
        return TupleVariable(out)

    def module_dict_method(self, tx, name):
        """``items()`` / ``keys()`` / ``values()`` of a ModuleDict, as a tuple of trackers."""
        keys = self._dict_keys(tx)
        values = [self._child(tx, self.module[k], ItemSource(self.source, k)) for k in keys]
        if name == "keys":
            return TupleVariable([ConstantVariable(k) for k in keys])
        if name == "values":
            return TupleVariable(values)
        return TupleVariable([TupleVariable([ConstantVariable(k), v]) for k, v in zip(keys, values)])

    def getitem(self, tx, key):
        if isinstance(self.module, torch.nn.ModuleDict):
            k = key.as_python()
            if k not in self._dict_keys(tx):
                raise Unsupported(f"ModuleDict has no key {k!r}")
            return self._child(tx, self.module[k], ItemSource(self.source, k))
        children = self._children(tx)
        key = key.as_python()
        if isinstance(key, slice):
            return ListVariable([self._child(tx, children[i], ItemSource(self.source, i))
                                 for i in range(len(children))[key]])
        if not isinstance(key, int):
            raise Unsupported(f"indexing {type(self.module).__name__} with {type(key).__name__}")
        return self._child(tx, children[key], ItemSource(self.source, key % len(children)))

    def call(self, tx, args, kwargs):
        from kiln.capture.module_call import call_module  # hooks inlined around forward
        return call_module(tx, self, args, kwargs)

    def __repr__(self):
        return f"Module({type(self.module).__name__} at {self.source})"


def _plain_module_method(module, name) -> bool:
    """True when ``module.<name>`` is torch.nn.Module's own method, not a user override."""
    return getattr(type(module), name, None) is getattr(torch.nn.Module, name)


class _Thunk(Variable):
    """A no-argument method whose result is computed when it is called."""

    def __init__(self, fn):
        self.fn = fn

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("unexpected arguments")
        return self.fn()


def _real_object(var):
    """The object a module or user-object tracker stands for (a method's ``self``)."""
    for attr in ("module", "value"):
        obj = getattr(var, attr, None)
        if obj is not None:
            return obj
    return var.as_python()


class FunctionVariable(Variable):
    """A user Python function; calling it inlines its bytecode in a new frame.

    Either a real function object (``fn``; its closure cells and defaults are read from it) or
    one made by MAKE_FUNCTION during the trace (``code`` with tracked defaults and cells).
    """

    def __init__(self, fn=None, *, source=None, self_var=None, code=None, globals_=None,
                 defaults=(), kwdefaults=None, closure=(), qualname=None):
        self.fn = fn
        self.source = source
        self.self_var = self_var
        self.code = fn.__code__ if fn is not None else code
        self.globals = fn.__globals__ if fn is not None else globals_
        self.defaults = defaults
        self.kwdefaults = kwdefaults or {}
        self.closure = closure
        self.qualname = fn.__qualname__ if fn is not None else \
            (qualname or getattr(self.code, "co_qualname", self.code.co_name))

    by_code = False  # guarded by code, globals and defaults' layout, not identity (tracer.wrap)
    method_name = None  # a module's method: the attribute it was read as (ModuleVariable._method)

    def python_type(self):
        return types.MethodType if self.self_var is not None else types.FunctionType

    def truth(self, tx):
        return True

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            value = getattr(self.fn, name) if self.fn is not None else \
                {"__name__": self.code.co_name, "__qualname__": self.qualname}.get(name)
            if self.by_code and isinstance(value, (str, type(None))):  # not implied by its code
                tx.guards.constant(tx.attr_source(self.source, name), value)
            return ConstantVariable(value)
        if name == "__func__" and self.self_var is not None:  # a bound method's function
            if self.fn is not None and self.source is None and self.method_name is not None \
                    and self.self_var.source is not None:
                # a module's method: reached again as ``m.<name>.__func__`` (guarded as any
                # function), so a value holding it can be stored or rebuilt at a graph break
                # (the kernels package's use_kernelized_func keeps it in a dict it stores)
                source = AttrSource(AttrSource(self.self_var.source, self.method_name), "__func__")
                return tx.wrap(self.fn, source)
            # this tracker's source, where it has one, is its function's (module_call.py)
            return FunctionVariable(self.fn, source=self.source) if self.fn is not None else \
                FunctionVariable(code=self.code, globals_=self.globals, defaults=self.defaults,
                                 kwdefaults=self.kwdefaults, closure=self.closure, qualname=self.qualname)
        if name in ("__wrapped__", "__func__") and self.fn is not None and hasattr(self.fn, name):
            return tx.wrap(getattr(self.fn, name), tx.attr_source(self.source, name))
        if name == "__self__" and self.self_var is not None:
            return self.self_var
        if name == "__code__":
            return ConstantVariable(self.code)
        if name == "__class__":  # torchvision's _log_api_usage_once reads obj.__class__.__name__
            return ConstantVariable(self.python_type())
        raise Unsupported(f"attribute {name!r} of {self} is not supported")

    def call(self, tx, args, kwargs):
        fn = self.fn
        if fn is not None:  # torch.compiler's marks on the function (capture/controls.py)
            if getattr(fn, "_kiln_graph_break", False):
                raise Unsupported("kiln.graph_break() called")
            if controls.is_disabled(fn):
                raise Unsupported(f"call to {self.qualname}, which is {controls.disabled_reason(fn)}")
            if controls.is_constant_result(fn):
                return self._constant_result(tx, args, kwargs)
            if self.self_var is None and controls.is_allowed_in_graph(fn):
                from kiln.capture.dispatch_trace import call_allowed_in_graph
                out = call_allowed_in_graph(tx, fn, self.qualname, args, kwargs)
                if out is not None:  # else: inlined below
                    return out
        if self.self_var is not None:
            args = [self.self_var] + list(args)
        return tx.inline_call(self, args, kwargs)

    def _constant_result(self, tx, args, kwargs):
        """``torch.compiler.assume_constant_result``: the function runs now, natively, once per
        compile, and its result is a constant of the graph, guarded by nothing: the user
        promised it does not change (as torch.compile takes it)."""
        what = f"{self.qualname} (marked assume_constant_result)"
        try:
            # a method's self is the real module or object (its state is promised constant too)
            owner = [] if self.self_var is None else [_real_object(self.self_var)]
            py_args = owner + [a.as_python() for a in args]
            py_kwargs = {k: v.as_python() for k, v in kwargs.items()}
        except Unsupported as e:
            raise Unsupported(f"{what}: its arguments must be Python constants ({e.reason})") from None
        try:
            out = self.fn(*py_args, **py_kwargs)
        except Exception as e:  # the user's error: this call runs eagerly and raises it there
            raise Unsupported(f"{what} raised {type(e).__name__}: {e}") from e
        if not is_constant(out):
            raise Unsupported(f"{what} returned a {type(out).__name__}, not a Python constant")
        return ConstantVariable(out)

    def __repr__(self):
        return f"Function({self.qualname})"


class BuiltinVariable(Variable):
    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def as_python(self):
        return self.fn

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        from kiln.capture.builtins import call_builtin
        return call_builtin(tx, self.fn, args, kwargs)

    def getattr(self, tx, name):
        if self.fn is dict and name == "fromkeys":  # DynamicCache's dict.fromkeys(range(n))
            return _DictFromKeys()
        if self.fn is dict and name in _DICT_DUNDERS:  # dict.__getitem__(self, k) in a subclass
            return _UnboundDictDunder(name)
        return super().getattr(tx, name)

    def __repr__(self):
        return f"Builtin({getattr(self.fn, '__name__', self.fn)})"


_DICT_DUNDERS = ("__getitem__", "__setitem__", "__delitem__", "__contains__", "__len__")


class _UnboundDictDunder(Variable):
    """``dict.__getitem__(obj, key)`` (and friends): dict's own behaviour on a tracked dict,
    past a subclass's override."""

    def __init__(self, name):
        self.name = name

    def call(self, tx, args, kwargs):
        from kiln.capture.values_dict import DictDunder
        if kwargs or not args or not isinstance(args[0], DictVariable):
            raise Unsupported(f"dict.{self.name} on {args[0] if args else 'nothing'} is not supported")
        return DictDunder(args[0], self.name).call(tx, list(args[1:]), {})


class _DictFromKeys(Variable):
    """``dict.fromkeys(keys, value=None)`` (also OrderedDict's and defaultdict's, whose result
    is of their class, a defaultdict's without a factory): every key maps to the one value, as
    Python's does."""

    def __init__(self, cls=dict):
        self.cls = cls

    def call(self, tx, args, kwargs):
        if set(kwargs) - {"value"} or not 1 <= len(args) + len(kwargs) <= 2:
            raise Unsupported(f"{self.cls.__name__}.fromkeys takes an iterable and an optional value")
        value = args[1] if len(args) == 2 else kwargs.get("value", ConstantVariable(None))
        items = {}
        for k in args[0].iterate(tx):
            items[dict_key(tx, k, items)] = value
        if self.cls is collections.OrderedDict:
            from kiln.capture.values_dict import OrderedDictVariable
            return OrderedDictVariable(items)
        if self.cls is collections.defaultdict:
            from kiln.capture.values_defaultdict import DefaultDictVariable
            return DefaultDictVariable(items, ConstantVariable(None))
        return DictVariable(items)


# torch's Python modules whose functions, where the capture table has no entry and a fallback
# node cannot serve, are inlined as user code: torch.nn.functional's helpers (_canonical_mask,
# _none_or_dtype, _mha_shape_check), the functions it builds from other torch calls
# (multi_head_attention_forward, which nn.MultiheadAttention and so torchvision's ViT call; the
# losses, with a gradient), and the argument parsers they call (_Reduction.get_enum, _pair). The
# table's entries still win, so an op kiln maps directly is never traced through torch's Python.
INLINED_TORCH_MODULES = frozenset({"torch.nn.functional", "torch.nn._reduction",
                                   "torch.nn.modules.utils", "torch.functional"})


# torch.nn.functional composites traced even where the fallback node would serve (no gradient
# needed): one opaque call runs eager's sequence of kernels, the traced body lets kiln fuse and
# lay them out. multi_head_attention_forward (nn.MultiheadAttention, torchvision's ViT) is eager's
# in-projection GEMM, head reshapes with copies, SDPA and the out-projection: traced, it is one
# packed addmm, SDPA on strided views and an addmm fused with its residual add (session 28's
# profile: the fallback cost ViT-B/16 inference on the H200 0.83x of torch.compile).
TRACED_WITHOUT_GRAD = frozenset({torch.nn.functional.multi_head_attention_forward})


# single torch Python functions inlined the same way: torch.nn.init's fan helpers are pure
# Python over a tensor's dim() and sizes (library code calls them in forward to scale weights);
# the rest of torch.nn.init writes into tensors under no_grad and stays out
INLINED_TORCH_FUNCTIONS = frozenset({torch.nn.init._calculate_fan_in_and_fan_out,
                                     torch.nn.init._calculate_correct_fan,
                                     torch.nn.init.calculate_gain})


def _inlined_torch_python(fn) -> bool:
    return isinstance(fn, types.FunctionType) and (
        fn.__module__ in INLINED_TORCH_MODULES or fn in INLINED_TORCH_FUNCTIONS) \
        and not controls.is_disabled(fn)


def _fallback_serves(tx, fn, adapter, args, kwargs) -> bool:
    """Whether the fallback node (one opaque call, kept where it works: a no-grad loss, a pool
    with indices) takes this call: it has a tensor argument and no gradient is needed through
    it. Otherwise torch's Python body is traced, which fuses and differentiates."""
    if adapter is None or fn in TRACED_WITHOUT_GRAD:
        return False
    todo, tensors = list(args) + list(kwargs.values()), []
    while todo:
        v = todo.pop()
        if isinstance(v, TensorVariable):
            tensors.append(v.proxy)
        elif isinstance(v, (ListVariable, TupleVariable)):
            todo.extend(v.items)
    return bool(tensors) and not (tx.grad_enabled and any(p.meta.requires_grad for p in tensors))


class TorchFunctionVariable(Variable):
    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def as_python(self):
        return self.fn

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        name = torch_api.callable_name(self.fn)
        if self.fn is torch.nonzero and tx.scalar_outputs:  # its size fixed by torch._check
            return sized_later.nonzero(tx, args, kwargs)
        folded = call_on_numbers(tx, self.fn, args, kwargs, name)
        if folded is not None:
            return folded
        adapter = torch_api.TORCH_FUNCTIONS.get(self.fn)
        if adapter is None and torch_optim.is_inlined_optim_code(self.fn):
            return torch_optim.optim_call(tx, self.fn, self.source).call(tx, args, kwargs)
        if adapter is None:
            adapter, why = fallback_adapter(self.fn, name)
            if _inlined_torch_python(self.fn):
                if _fallback_serves(tx, self.fn, adapter, args, kwargs):
                    try:  # the fallback refuses before it records anything (no tensor result)
                        return tx.call_adapter(adapter, args, kwargs, name)
                    except Unsupported:
                        pass
                return FunctionVariable(self.fn, source=self.source).call(tx, args, kwargs)
            if adapter is None:
                raise Unsupported(f"call to {name} is not supported (not in the capture table; {why})")
        return tx.call_adapter(adapter, args, kwargs, name)

    def getattr(self, tx, name):
        if torch_optim.is_inlined_optim_code(self.fn):  # ``step.__get__(opt, cls)`` (torch_optim.py)
            return torch_optim.function_attribute(tx, self.fn, self.source, name)
        return super().getattr(tx, name)

    def __repr__(self):
        return f"TorchFunction({torch_api.callable_name(self.fn)})"


class PythonModuleVariable(Variable):
    def __init__(self, module, source=None):
        self.module = module
        self.source = source

    def as_python(self):
        return self.module

    def truth(self, tx):
        return True

    def getattr(self, tx, name):
        try:
            value = getattr(self.module, name)
        except AttributeError as e:
            raise Unsupported(str(e)) from None
        trusted = self.module.__name__.split(".")[0] in ("torch", "math", "operator")
        return tx.wrap(value, tx.attr_source(self.source, name), guard=not trusted)

    def __repr__(self):
        return f"PythonModule({self.module.__name__})"
