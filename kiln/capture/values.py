"""Value trackers: what the symbolic interpreter keeps on its stack and in its locals.

Every Python value the traced code touches is represented by a ``Variable``:

- ``TensorVariable``: a tensor, as a ``kiln.graph.Proxy`` into the graph being built;
- ``ConstantVariable``: an immutable Python value we specialize on (int, float, bool, str,
  None, torch.dtype, torch.device, torch.Size, range, slice, a class);
- ``TupleVariable`` / ``ListVariable`` / ``DictVariable``: containers of Variables;
- ``MethodVariable``: ``obj.name`` bound to a tracked object (``x.relu``, ``lst.append``);
- ``IteratorVariable``, ``CellVariable``, ``NullVariable``, ``LazyVariable`` (an argument not
  yet read), ``OpaqueVariable`` (anything else: it can be passed around but not used).

The code the traced program calls into (``ModuleVariable``, ``FunctionVariable``,
``BuiltinVariable``, ``TorchFunctionVariable``, ``PythonModuleVariable``) is tracked in
values_callables.py, plain Python objects and classes in values_python.py.

A Variable with a ``source`` came from the frame's inputs; the guards that make reusing the
capture safe are installed when such a value is wrapped (``Tracer.wrap``).
"""
from __future__ import annotations

import collections
import operator

import torch

from kiln.capture import torch_api
from kiln.capture.fallback import fallback_adapter, inplace_fallback_adapter
from kiln.capture.dict_keys import dict_key, key_variable, merge_items, refuse_tensor_keys
from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.mutation import refresh
from kiln.meta.symbolic import SymInt, SymSize

CONSTANT_TYPES = (int, float, bool, str, type(None), complex, torch.dtype, torch.device,
                  type(Ellipsis), torch.memory_format, torch.layout, range, slice, torch.Size,
                  SymInt, SymSize)  # symbolic sizes are constants whose comparisons are guarded


def is_constant(value) -> bool:
    if type(value) in CONSTANT_TYPES:
        return True
    if type(value) is tuple and all(is_constant(v) for v in value):
        return True
    return isinstance(value, type)


class Variable:
    source = None

    def python_type(self):
        raise Unsupported(f"the type of {self} is not known")

    def as_python(self):
        """The Python value, for values capture can compute with (constants, containers of them)."""
        raise Unsupported(f"{self} is not a Python constant")

    def getattr(self, tx, name):
        raise Unsupported(f"attribute {name!r} of {self} is not supported")

    def call(self, tx, args, kwargs):
        raise Unsupported(f"calling {self} is not supported")

    def iterate(self, tx) -> list:
        raise Unsupported(f"iterating over {self} is not supported")

    def truth(self, tx) -> bool:
        return bool(self.as_python())

    def __repr__(self):
        return type(self).__name__


class NullVariable(Variable):
    """The NULL that CPython 3.11+ pushes below a callable (PUSH_NULL, LOAD_GLOBAL's flag bit)."""

    def __repr__(self):
        return "NULL"


NULL = NullVariable()


class LazyVariable(Variable):
    """An input value not read yet: it is wrapped (and guarded) on first use."""

    def __init__(self, value, source):
        self.value = value
        self.source = source


class ConstantVariable(Variable):
    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        if isinstance(self.value, SymInt):
            return int
        return tuple if isinstance(self.value, SymSize) else type(self.value)

    def as_python(self):
        return self.value

    def getattr(self, tx, name):
        if name == "fromkeys" and self.value in (collections.OrderedDict, collections.defaultdict):
            from kiln.capture.values_callables import _DictFromKeys
            return _DictFromKeys(self.value)
        if isinstance(self.value, type) and (not _is_library_class(self.value)
                                             or issubclass(self.value, torch.optim.Optimizer)):
            from kiln.capture.values_python import attribute_of_class
            out = attribute_of_class(tx, self.value, name, None, self.source)
            if out is not None:
                return out
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(str(e)) from None
        if is_constant(attr):
            return ConstantVariable(attr)
        if callable(attr):
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of {self.value!r} is not supported")

    def call(self, tx, args, kwargs):
        if isinstance(self.value, type):
            from kiln.capture.values_python import call_class
            return call_class(tx, self.value, args, kwargs)
        return super().call(tx, args, kwargs)

    def iterate(self, tx):
        try:
            return [ConstantVariable(v) for v in self.value]
        except TypeError:
            raise Unsupported(f"{self.value!r} is not iterable") from None

    def __repr__(self):
        return f"Constant({self.value!r})"


class TensorVariable(Variable):
    made_leaf = False  # requires_grad_() with grad mode off on a tensor made here (made_leaves.py)

    def __init__(self, proxy, python_type=torch.Tensor, source=None):
        self._proxy = proxy
        self._type = python_type
        self.source = source
        self.alias = None  # mutation.Alias: storage + view chain, once aliasing matters
        self._seen = 0     # the storage version _proxy was computed at

    @property
    def proxy(self):
        # A view whose storage was written since it was last read replays its view chain.
        a = self.alias
        if a is not None and (self._seen != a.storage.version or a.storage.poisoned):
            refresh(self)
        return self._proxy

    @proxy.setter
    def proxy(self, value):
        self._proxy = value

    def python_type(self):
        return self._type

    def getattr(self, tx, name):
        if self.made_leaf or name == "requires_grad_":
            from kiln.capture import made_leaves
            if name == "requires_grad_":
                return made_leaves.RequiresGradMethod(self)
            found = made_leaves.leaf_attribute(self, name)
            if found is not None:
                return found
        if name in torch_api.TENSOR_ATTRIBUTES:
            return ConstantVariable(torch_api.TENSOR_ATTRIBUTES[name](self.proxy))
        if name == "__class__":  # type(x), not torch.Tensor's metaclass called as a method
            return ConstantVariable(self.python_type())
        if name == "grad":  # an input's gradient, as an optimizer reads it (torch_optim.py)
            from kiln.capture.torch_optim import input_grad
            return input_grad(tx, self)
        if name in torch_api.TENSOR_VIEW_ATTRIBUTES:  # .T, .mT: attributes that are tensors
            return tx.call_adapter(torch_api.TENSOR_VIEW_ATTRIBUTES[name], [self], {}, f"Tensor.{name}")
        if name in torch_api.TENSOR_METHODS:
            return MethodVariable(self, name)
        if name == "nonzero" and tx.scalar_outputs:  # its size fixed by torch._check (sized_later.py)
            from kiln.capture.sized_later import NonzeroMethod
            return NonzeroMethod(self)
        if name == "item" and tx.input_items:
            from kiln.capture.item_values import input_item
            return input_item(tx, self)
        method = getattr(torch.Tensor, name, None)
        if callable(method):
            adapter, why = fallback_adapter(method, f"Tensor.{name}")
            if adapter is None and name.endswith("_") and not name.startswith("_"):
                adapter, why = inplace_fallback_adapter(name)
            if adapter is not None:
                return BoundAdapterVariable(self, adapter, f"Tensor.{name}")
            # the break happens at the call (where a resume function can pick up), not here
            return BoundAdapterVariable(self, _refuse(f"Tensor.{name} is not supported by the "
                                                      f"capture table ({why})"), f"Tensor.{name}")
        raise Unsupported(f"Tensor.{name} is not supported by the capture table")

    def setattr(self, tx, name, value):
        if name != "requires_grad":
            raise Unsupported(f"assigning attribute {name!r} of a tensor is not supported")
        from kiln.capture.made_leaves import set_requires_grad
        set_requires_grad(tx, self, value)

    def iterate(self, tx):
        raise Unsupported("iterating over a tensor is not supported")

    def truth(self, tx):
        numel = self.proxy.meta.numel()
        if type(numel) is int and numel != 1:
            raise EagerRaises(f"the truth value of a tensor with {numel} elements: eager raises "
                              "(Boolean value of Tensor with more than one value is ambiguous)")
        raise Unsupported("data-dependent branch: the truth value of a tensor depends on its data")

    def __repr__(self):
        return f"Tensor({self.proxy.node.name}: {self.proxy.meta})"


class _Sequence(Variable):
    kind = tuple

    def __init__(self, items, source=None):
        self.items = list(items)
        self.source = source

    def python_type(self):
        return self.kind

    def as_python(self):
        return self.kind(v.as_python() for v in self.items)

    def iterate(self, tx):
        return list(self.items)

    def truth(self, tx):
        return bool(self.items)

    def getitem(self, tx, key):
        key = key.as_python()
        if isinstance(key, slice):
            return type(self)(self.items[key])
        if isinstance(key, SymInt):  # cache.layers[self.layer_idx], layer_idx dynamic
            from kiln.capture.dynamic_index import symbolic_item
            return symbolic_item(tx, self, key)
        if not isinstance(key, int):
            raise Unsupported(f"indexing a {self.kind.__name__} with {type(key).__name__}")
        try:
            return self.items[key]
        except IndexError:
            raise Unsupported(f"{self.kind.__name__} index {key} out of range") from None

    def getattr(self, tx, name):
        if name in ("index", "count"):
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a {self.kind.__name__} is not supported")

    def call_method(self, tx, name, args, kwargs):
        if name in ("index", "count"):
            value = getattr(self.as_python(), name)(*[a.as_python() for a in args])
            return ConstantVariable(value)
        raise Unsupported(f"{self.kind.__name__}.{name} is not supported")

    def __repr__(self):
        return f"{type(self).__name__}({self.items!r})"


class TupleVariable(_Sequence):
    kind = tuple


class ListVariable(_Sequence):
    kind = list

    def getattr(self, tx, name):
        if name in ("append", "extend", "insert", "pop", "index", "count", "reverse", "sort",
                    "clear", "remove", "copy"):
            return MethodVariable(self, name)
        return super().getattr(tx, name)

    def check_mutable(self, tx=None):
        """A list reached from the inputs may change: the write is replayed (side_effects.py)."""
        if self.source is not None:
            if tx is None:
                raise Unsupported("mutating a list that is an input of the function is not supported")
            tx.side_effects.mutate(self)

    def call_method(self, tx, name, args, kwargs):
        if name in ("index", "count"):
            return super().call_method(tx, name, args, kwargs)
        if name == "copy" and not args:
            return ListVariable(self.items)
        self.check_mutable(tx)
        if kwargs:
            raise Unsupported(f"list.{name} with keyword arguments")
        if name == "sort" and not args:
            keys = [v.as_python() for v in self.items]
            self.items[:] = [self.items[i] for i in sorted(range(len(keys)), key=keys.__getitem__)]
        elif name == "reverse" and not args:
            self.items.reverse()
        elif name == "clear" and not args:
            self.items.clear()
        elif name == "remove" and len(args) == 1:
            keys = [v.as_python() for v in self.items]
            del self.items[keys.index(args[0].as_python())]
        elif name == "append" and len(args) == 1:
            self.items.append(args[0])
        elif name == "extend" and len(args) == 1:
            self.items.extend(args[0].iterate(tx))
        elif name == "insert" and len(args) == 2:
            self.items.insert(args[0].as_python(), args[1])
        elif name == "pop" and len(args) <= 1:
            return self.items.pop(*(a.as_python() for a in args))
        else:
            raise Unsupported(f"list.{name} with {len(args)} arguments is not supported")
        return ConstantVariable(None)


class DictVariable(Variable):
    def __init__(self, items: dict, source=None):
        self.items = dict(items)  # Python constant key -> Variable
        self.source = source

    def python_type(self):
        return dict

    def as_python(self):
        refuse_tensor_keys(self.items, "a Python value of")
        return {k: v.as_python() for k, v in self.items.items()}

    def iterate(self, tx):
        return [key_variable(tx, k) for k in self.items]

    def truth(self, tx):
        return bool(self.items)

    def getitem(self, tx, key):
        key = dict_key(tx, key, self.items)
        if key not in self.items:
            raise Unsupported(f"key {key!r} is not in the dict")
        return self.items[key]

    def merged_items(self) -> dict:
        """What ``{**d}``, ``dict(d)`` and ``x.update(d)`` copy (a dict subclass may differ)."""
        return self.items

    def getattr(self, tx, name):
        if name in ("keys", "values", "items", "get", "update", "pop", "setdefault", "copy",
                    "clear"):
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a dict is not supported")

    def call_method(self, tx, name, args, kwargs):
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVariable(self, name)  # live: a later insertion shows in it
        if name == "get":
            key = dict_key(tx, args[0], self.items)
            default = args[1] if len(args) > 1 else ConstantVariable(None)
            return self.items.get(key, default)
        if name == "copy" and not args:
            return DictVariable(self.items)
        if name in ("update", "pop", "setdefault", "clear") and self.source is not None:
            tx.side_effects.mutate(self)  # replayed after the call (side_effects.py)
        if name == "update" and (not args or len(args) == 1 and isinstance(args[0], DictVariable)):
            merge_items(tx, self.items, args[0].merged_items() if args else {})
            self.items.update(kwargs)
            return ConstantVariable(None)
        if name == "update" and len(args) == 1 and hasattr(args[0], "iterate"):
            pairs = _key_value_pairs(tx, args[0])  # [(k, v), [k, v]], zip(keys, values)
            if pairs is not None:
                merge_items(tx, self.items, pairs)
                self.items.update(kwargs)
                return ConstantVariable(None)
        if name == "pop" and len(args) in (1, 2):
            key = dict_key(tx, args[0], self.items)
            if key in self.items:
                return self.items.pop(key)
            if len(args) == 2:
                return args[1]
            raise Unsupported(f"dict.pop of missing key {key!r}")
        if name == "setdefault" and len(args) in (1, 2):
            key = dict_key(tx, args[0], self.items)
            if key not in self.items:
                self.items[key] = args[1] if len(args) == 2 else ConstantVariable(None)
            return self.items[key]
        if name == "clear" and not args:
            self.items.clear()
            return ConstantVariable(None)
        raise Unsupported(f"dict.{name} is not supported here")

    def __repr__(self):
        return f"Dict({self.items!r})"


def _key_value_pairs(tx, iterable):
    """dict.update's iterable of pairs as {key: value} (dict_keys.dict_key), or None (a
    break) where an item is not a pair or a key is neither a constant nor an input tensor."""
    try:
        items = iterable.iterate(tx)
    except Unsupported:
        return None
    pairs = {}
    for item in items:
        if not isinstance(item, (TupleVariable, ListVariable)) or len(item.items) != 2:
            return None
        key = item.items[0]
        if isinstance(key, TensorVariable):
            pairs[dict_key(tx, key, pairs)] = item.items[1]
            continue
        if not isinstance(key, ConstantVariable) or not is_constant(key.value):
            return None
        pairs[key.value] = item.items[1]
    return pairs


class DictViewVariable(Variable):
    """``d.keys()`` / ``d.values()`` / ``d.items()``: a live view of the dict's tracker, read
    when it is used (taken before an insertion, it shows the insertion, as in Python)."""

    _TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}

    def __init__(self, dict_var, kind):
        self.dict_var, self.kind = dict_var, kind

    def python_type(self):
        return self._TYPES[self.kind]

    def iterate(self, tx=None):
        items = self.dict_var.items
        if self.kind == "keys":
            return [key_variable(tx, k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [TupleVariable([key_variable(tx, k), v]) for k, v in items.items()]

    def as_python(self):
        if self.kind == "keys":
            refuse_tensor_keys(self.dict_var.items, "a Python value of the keys of")
            return dict.fromkeys(self.dict_var.items).keys()
        return getattr(self.dict_var.as_python(), self.kind)()

    def truth(self, tx):
        return bool(self.dict_var.items)

    def python_len(self, tx):
        return ConstantVariable(len(self.dict_var.items))

    def contains(self, tx, item) -> bool:
        if self.kind == "keys":
            return dict_key(tx, item, self.dict_var.items) in self.dict_var.items
        return item.as_python() in [v.as_python() for v in self.iterate(tx)]

    def getattr(self, tx, name):
        if name in ("isdisjoint", "mapping"):
            raise Unsupported(f"dict view .{name} is not supported")
        raise Unsupported(f"attribute {name!r} of a dict view is not supported")

    def reconstruct(self, builder):
        """At a graph break: the dict, then its view method called again."""
        from kiln.capture.resume import Instr, _call, _load_attr
        builder.emit(Instr("PUSH_NULL"))
        builder.load(self.dict_var)
        builder.emit(_load_attr(self.kind), *_call(0))

    def __repr__(self):
        return f"DictView({self.kind})"


class IteratorVariable(Variable):
    def __init__(self, items):
        self.items = list(items)
        self.pos = 0

    def next(self):
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]

    def iterate(self, tx):
        rest = self.items[self.pos:]
        self.pos = len(self.items)
        return rest

    def as_python(self):
        """The remaining items' values, without consuming them (for builtins on constants)."""
        return iter([v.as_python() for v in self.items[self.pos:]])

    def python_type(self):
        return type(iter(()))


class CellVariable(Variable):
    """A closure cell: created by MAKE_CELL, or wrapping a real cell of a function we inline."""

    def __init__(self, contents=None):
        self.contents = contents  # a Variable (possibly Lazy), or None when empty
        self.cell_source = None   # Source of the real cell object, when writes must be replayed


class MethodVariable(Variable):
    """``obj.name`` for a tracked obj; calling dispatches on the object's kind."""

    def __init__(self, obj, name):
        self.obj = obj
        self.name = name

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        obj = self.obj
        if isinstance(obj, TensorVariable):
            return tx.call_adapter(torch_api.TENSOR_METHODS[self.name], [obj, *args], kwargs,
                                   f"Tensor.{self.name}")
        if isinstance(obj, ConstantVariable) and obj.value is torch.Tensor and args \
                and isinstance(args[0], TensorVariable):
            # ``torch.Tensor.acos_(x)``: the unbound method is x's method
            return args[0].getattr(tx, self.name).call(tx, list(args[1:]), kwargs)
        if isinstance(obj, ConstantVariable):
            try:
                py_args = [a.as_python() for a in args]
                py_kwargs = {k: v.as_python() for k, v in kwargs.items()}
                return tx.wrap_constant(getattr(obj.value, self.name)(*py_args, **py_kwargs))
            except Unsupported:
                raise
            except Exception as e:
                raise Unsupported(f"{type(obj.value).__name__}.{self.name} raised {e!r}") from None
        if isinstance(obj, (_Sequence, DictVariable)):
            return obj.call_method(tx, self.name, args, kwargs)
        raise Unsupported(f"calling {self.name} on {obj} is not supported")

    def __repr__(self):
        return f"Method({self.obj}.{self.name})"


def _refuse(reason):
    """An adapter that always breaks the graph (a Tensor method capture must not record)."""
    def adapter(*args, **kwargs):
        raise Unsupported(reason)
    return adapter


class BoundAdapterVariable(Variable):
    """``tensor.method`` whose call goes through an adapter made on the fly (fallback nodes)."""

    def __init__(self, obj, adapter, name):
        self.obj, self.adapter, self.name = obj, adapter, name

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        return tx.call_adapter(self.adapter, [self.obj, *args], kwargs, self.name)

    def __repr__(self):
        return f"Method({self.obj}.{self.name})"


class OpaqueVariable(Variable):
    """A value capture does not model: it can be stored and passed on, nothing else."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def call(self, tx, args, kwargs):
        raise Unsupported(f"call to {torch_api.callable_name(self.value)} is not supported")

    def getattr(self, tx, name):
        raise Unsupported(f"attribute {name!r} of a {type(self.value).__name__} object is not supported")

    def __repr__(self):
        return f"Opaque({type(self.value).__name__})"


def _is_library_class(cls) -> bool:
    # a class a library made at run time over a user class (FSDP2's ``FSDP<Block>``, whose
    # ``__module__`` is torch's) resolves its attributes like the user class it extends
    return all((k.__module__ or "").split(".")[0] in ("builtins", "torch", "typing", "collections")
               for k in getattr(cls, "__mro__", (cls,)))


# Python operators on constants, by dis's spelling.
PYTHON_OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "<<": operator.lshift, ">>": operator.rshift, "&": operator.and_, "|": operator.or_,
    "^": operator.xor, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
}
