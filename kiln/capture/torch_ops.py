"""``torch.ops.aten.*`` / ``torch.ops.prims.*`` during capture.

Code written against the op registry calls ``aten.add(x, y)`` (an ``OpOverloadPacket``) or
``aten.mul.Tensor(x, 2)`` (an ``OpOverload``). Capture does not need a second op table for
them: the arguments are bound to the overload's schema (for a packet, the first overload whose
schema accepts them, as torch's own dispatcher picks), and the call is routed to the torch-level
function of the same name (``torch.<name>``, ``F.<name>``, ``torch._C._nn.<name>``,
``Tensor.<name>``) whose capture rule already exists, when that function takes the schema's
arguments in the schema's order. Any other op becomes a ``core.fallback`` node running the
overload itself (kiln/capture/fallback.py; a result that may be a view of an argument is tracked
as an uncertain view there), as do all ``prims`` ops (their semantics are not the torch
functions' of the same name). Ops that mutate or draw random numbers stay graph breaks.
Ops of other namespaces (``torch.library.custom_op`` functions, ``Library.define`` ops) are
opaque ``core.custom_op`` nodes (kiln/capture/custom_ops.py).
"""
from __future__ import annotations

import inspect
import types

import torch

from kiln.capture import custom_ops, known_constants, torch_api, torch_api_creation
from kiln.capture.errors import Unsupported
from kiln.capture.fallback import fallback_adapter
from kiln.capture.values import ConstantVariable, TensorVariable, Variable
from kiln.graph import Proxy
from kiln.graph.proxy import active_graph
from kiln.ops import core

_OVERLOAD_ORDER = ("default", "Tensor", "Scalar")  # tried first, in this order, like torch


def is_op(value) -> bool:
    return isinstance(value, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)) \
        or custom_ops.custom_op_def(value) is not None


class TorchOpVariable(Variable):
    """An ``OpOverloadPacket`` or ``OpOverload`` of torch's op registry (a
    ``torch.library.custom_op`` function stands for its ``OpOverload``)."""

    def __init__(self, op, source=None):
        self.value = op
        self.op = custom_ops.custom_op_def(op) or op
        self.source = source

    def as_python(self):
        return self.value

    def truth(self, tx):
        return True

    def getattr(self, tx, name):
        if isinstance(self.op, torch._ops.OpOverloadPacket):
            try:
                value = getattr(self.op, name)
            except AttributeError as e:
                raise Unsupported(f"{self}: {e}") from None
            if isinstance(value, torch._ops.OpOverload):
                return TorchOpVariable(value, tx.attr_source(self.source, name))
        raise Unsupported(f"attribute {name!r} of {self} is not supported")

    def call(self, tx, args, kwargs):
        name = _op_name(self.op)
        what = f"torch.ops.{name}"
        py_args = [tx.unwrap(a, what) for a in args]
        py_kwargs = {k: tx.unwrap(v, what) for k, v in kwargs.items()}
        overload, bound = _resolve(self.op, py_args, py_kwargs)
        if overload is None:
            raise Unsupported(f"{what}: no overload's schema accepts these arguments")
        schema = overload._schema
        if custom_ops.is_user_op(overload):  # torch.library ops: opaque nodes (capture/custom_ops.py)
            return _route_user_op(tx, overload, *_call_form(schema, bound, args, kwargs))
        op_name = schema.name.split("::", 1)[-1]
        if schema.is_mutable and not (op_name.endswith("_") and op_name in torch_api.TENSOR_METHODS):
            functional = _functional_of(schema)
            if functional is None:
                raise Unsupported(f"{what}: the op mutates its arguments (not captured)")
            return _write_into_self(tx, functional, args, kwargs, what)
        if not schema.is_mutable and _all_numbers(args, kwargs):
            # as called: a packet picks its overload in torch (aten.add(4, 3.3) is add.Tensor)
            return tx.call_adapter(_on_numbers(self.op), args, kwargs, what)
        pos, kw = _call_form(schema, bound, args, kwargs)
        return _route(tx, overload, schema, pos, kw)

    def __repr__(self):
        return f"TorchOp({_op_name(self.op)})"


def _functional_of(schema):
    """``aten.hardswish_`` -> ``aten.hardswish``: an in-place elementwise op whose only write
    is to ``self`` (not a view op that changes self's shape: ``unsqueeze_``), or None."""
    namespace, name = schema.name.split("::", 1)
    args = schema.arguments
    if namespace != "aten" or not name.endswith("_") or not args or args[0].name != "self":
        return None
    writes = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    if writes != [args[0]] or name[:-1] in _SHAPE_CHANGING:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    if packet is None:
        return None
    # the functional overload with the same parameters and defaults: aten.bernoulli_.float
    # (p=0.5) is aten.bernoulli.p, not aten.bernoulli.default (whose p is self)
    want = _parameters(schema)
    for overload_name in packet.overloads():
        overload = getattr(packet, overload_name)
        if _parameters(overload._schema) == want:
            return overload
    return None


def _parameters(schema):
    return [(a.name, str(a.type), repr(a.default_value), a.kwarg_only) for a in schema.arguments]


# in-place ops that change self's metadata, not its values
# (``resize_as`` is autograd's deprecated same-numel reshape, not ``resize_as_`` without the write:
# read as its functional form, ``x.resize_as_(bigger)`` failed at capture and ran the whole frame
# eagerly; refused here, it is a graph break that resumes)
_SHAPE_CHANGING = {"unsqueeze", "squeeze", "transpose", "t", "resize", "resize_as", "as_strided", "swapdims",
                   "swapaxes", "set", "detach", "sparse_resize", "sparse_resize_and_clear", "resize_as_sparse"}


def _write_into_self(tx, functional, args, kwargs, what):
    """``self.op_(...)``: the functional op's result written into self (functionalized, every
    alias sees it), returning self, as eager; a result of another dtype is a break (eager casts
    some and refuses others)."""
    if not args or not isinstance(args[0], TensorVariable):
        raise Unsupported(f"{what}: the op mutates its arguments (not captured)")
    result = TorchOpVariable(functional).call(tx, args, kwargs)
    if not isinstance(result, TensorVariable) or result.proxy.dtype != args[0].proxy.dtype \
            or tuple(result.proxy.shape) != tuple(args[0].proxy.shape):
        raise Unsupported(f"{what}: the result's dtype or shape differs from self's")
    return tx._inplace_update(args[0], result, what)


def _op_name(op) -> str:
    if isinstance(op, torch._ops.OpOverload):
        packet = op.overloadpacket
        return f"{packet._qualified_op_name.replace('::', '.')}.{op._overloadname}"
    return op._qualified_op_name.replace("::", ".")


def _resolve(op, args, kwargs):
    """(overload, {param: ('arg', i) | ('kw', name)}) for the first schema accepting the call."""
    if isinstance(op, torch._ops.OpOverload):
        bound = _bind(op._schema, args, kwargs, strict=False)
        return (op, bound) if bound is not None else (None, None)
    names = [n for n in op.overloads() if "out" not in n.split("_")]
    names.sort(key=lambda n: _OVERLOAD_ORDER.index(n) if n in _OVERLOAD_ORDER else len(_OVERLOAD_ORDER))
    for strict in (True, False):  # a number is accepted for a Tensor parameter only if no exact match
        for n in names:
            overload = getattr(op, n)
            bound = _bind(overload._schema, args, kwargs, strict)
            if bound is not None:
                return overload, bound
    return None, None


def _bind(schema, args, kwargs, strict):
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    if len(args) > len(positional):
        return None
    bound = {}
    for p, i in zip(positional, range(len(args))):
        bound[p.name] = ("arg", i)
    for k in kwargs:
        if k in bound or not any(p.name == k for p in params):
            return None
        bound[k] = ("kw", k)
    for p in params:
        if p.name not in bound:
            if not p.has_default_value() and not _is_optional(p.type):
                return None
            continue
        kind, key = bound[p.name]
        value = args[key] if kind == "arg" else kwargs[key]
        if not _matches(getattr(p, "real_type", p.type), value, strict):
            return None
    return bound


def _is_optional(ty) -> bool:
    return isinstance(ty, torch._C.OptionalType)


def _is_number(v) -> bool:
    return not isinstance(v, (Proxy, torch.Tensor, str, list, tuple, torch.dtype, type(None))) \
        and not isinstance(v, (torch.layout, torch.device, torch.memory_format))


def _matches(ty, v, strict: bool) -> bool:
    kind = ty.kind()
    if kind == "OptionalType":
        return v is None or _matches(ty.getElementType(), v, strict)
    if kind == "TensorType":
        return isinstance(v, (Proxy, torch.Tensor)) or (not strict and _is_number(v))
    if kind == "ListType":
        elem = ty.getElementType()
        if isinstance(v, (list, tuple)):
            return all(_matches(elem, x, strict) for x in v)
        return elem.kind() in ("IntType", "SymIntType") and _is_number(v)  # int[1] dim=1
    if kind in ("IntType", "SymIntType"):
        return _is_number(v) and not isinstance(v, (float, complex))
    if kind == "BoolType":
        return isinstance(v, bool)
    if kind in ("FloatType", "NumberType"):
        return _is_number(v) and not (strict and kind == "FloatType" and isinstance(v, complex))
    if kind == "StringType":
        return isinstance(v, str)
    if kind == "ScalarTypeType":
        return isinstance(v, torch.dtype) or (type(v) is int and v in _SCALAR_TYPES)
    if kind == "LayoutType":
        return isinstance(v, torch.layout) or v == 0
    if kind == "DeviceObjType":
        return isinstance(v, (torch.device, str))
    if kind == "MemoryFormatType":
        return isinstance(v, torch.memory_format)
    return False  # generators, streams, dimnames...: not captured


# Schemas type a dtype as an int (c10::ScalarType's value: ``dtype=6`` is float32) and code
# written against them passes such ints; torch-level functions want torch.dtype.
_SCALAR_TYPES = dict(enumerate([torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                torch.float16, torch.float32, torch.float64, torch.complex32,
                                torch.complex64, torch.complex128, torch.bool]))
_SCALAR_TYPES[15] = torch.bfloat16


def _normalized(arg, v):
    """A ScalarType / Layout given as its enum int, as the torch object."""
    if isinstance(v, ConstantVariable) and type(v.value) is int:
        kind = getattr(arg, "real_type", arg.type)
        kind = kind.getElementType().kind() if kind.kind() == "OptionalType" else kind.kind()
        if kind == "ScalarTypeType":
            return ConstantVariable(_SCALAR_TYPES[v.value])
        if kind == "LayoutType":
            return ConstantVariable(torch.strided)
    return v


def _call_form(schema, bound, args, kwargs):
    """Positional Variables (schema order, defaults filled between) and keyword Variables (only
    those differing from their defaults: torch-level functions lack some aten-only keywords)."""
    by_name = {a.name: a for a in schema.arguments}

    def var(name):
        kind, key = bound[name]
        return _normalized(by_name[name], args[key] if kind == "arg" else kwargs[key])
    positional = [p for p in schema.arguments if not p.kwarg_only]
    last = max((i for i, p in enumerate(positional) if p.name in bound), default=-1)
    pos = []
    for p in positional[:last + 1]:
        pos.append(var(p.name) if p.name in bound else ConstantVariable(p.default_value))
    kw = {}
    for p in schema.arguments:
        if p.kwarg_only and p.name in bound:
            v = var(p.name)
            if isinstance(v, ConstantVariable) and p.has_default_value() and v.value == p.default_value \
                    and type(v.value) is type(p.default_value):
                continue
            if isinstance(v, ConstantVariable) and v.value is None:
                continue
            kw[p.name] = v
    return pos, kw


def _slice(x, dim=0, start=None, end=None, step=1):
    return core.slice(x, dim, start, end, step)


def _constant_pad_nd(x, pad, value=0):
    return torch_api.TORCH_FUNCTIONS[torch.nn.functional.pad](x, pad, "constant", value)


# aten ops whose torch-level form has another name or signature: the capture adapter to use
ALIASES = {"slice": _slice, "constant_pad_nd": _constant_pad_nd}
# prims ops with a capture rule (a factory: no tensor argument a fallback node could take)
PRIMS_RULES_NS = ("prims",)
PRIMS_RULES = {"iota": torch_api_creation.iota}


def _torch_level(name: str, schema, pos, kw):
    """The capture adapter of the torch-level function named like the aten op, or None. Torch's
    C++-bound functions and Tensor methods are generated from the same schema (the same
    positional order and keywords); a Python function (``F.elu(input, alpha, inplace)`` against
    ``aten::elu(self, alpha, scale, input_scale)``) is used only if its signature agrees."""
    if name in ALIASES:
        return ALIASES[name]
    for ns in (torch, torch.nn.functional, torch._C._nn, torch.special, torch.linalg):
        fn = getattr(ns, name, None)
        if fn is not None and not _signature_agrees(fn, schema, len(pos), kw):
            continue
        try:
            adapter = torch_api.TORCH_FUNCTIONS.get(fn) if fn is not None else None
        except TypeError:  # unhashable
            adapter = None
        if adapter is not None:
            return adapter
    first = schema.arguments[0] if schema.arguments else None
    method = getattr(torch.Tensor, name, None)
    if first is not None and first.name == "self" and name in torch_api.TENSOR_METHODS \
            and _signature_agrees(method, schema, len(pos), kw):
        return torch_api.TENSOR_METHODS[name]
    return None


def _signature_agrees(fn, schema, n_pos, kw):
    if not isinstance(fn, types.FunctionType):
        return True  # generated from the schema itself
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    want = [a.name for a in schema.arguments if not a.kwarg_only][:n_pos]
    if len(names) < len(want) or names[1:len(want)] != want[1:]:
        return False
    accepted = {p.name for p in params}
    return all(k in accepted for k in kw) or any(p.kind == p.VAR_KEYWORD for p in params)


def _all_numbers(pos, kw) -> bool:
    """Only Python numbers (and None, strings, dtypes): ``aten.add(4, 3.3)``, whose operands
    torch wraps into 0-d tensors. Random ops never get here (a break above)."""
    values = [a.value if isinstance(a, ConstantVariable) else a for a in list(pos) + list(kw.values())]
    if not all(isinstance(a, ConstantVariable) for a in list(pos) + list(kw.values())):
        return False
    return any(isinstance(v, (int, float)) for v in values) and all(
        v is None or isinstance(v, (bool, int, float, str, torch.dtype)) for v in values)


def _on_numbers(overload):
    """The op run on its (specialized, guarded) numbers at trace time: a constant of the graph,
    as ``torch.tensor(3.3)`` is."""

    def adapter(*args, **kwargs):
        out = overload(*args, **kwargs)
        if isinstance(out, (bool, int, float)):  # aten.add.default(4, 3.3) is the number 7.3
            return out
        graph = active_graph()
        if not isinstance(out, torch.Tensor) or graph is None or out.numel() > 1 << 16:
            raise Unsupported(f"{overload} on numbers only returns no number or small tensor")
        return known_constants.constant(graph, out)  # its value stays known (a size, Longformer)
    return adapter


def _route(tx, overload, schema, pos, kw):
    namespace, name = schema.name.split("::", 1)
    label = f"torch.ops.{_op_name(overload)}"
    if namespace in PRIMS_RULES_NS and name in PRIMS_RULES:  # a prim whose meaning is plain
        return tx.call_adapter(PRIMS_RULES[name], pos, kw, label)
    # prims differ from the torch functions of their names (prims.div truncates integers)
    adapter = _torch_level(name, schema, pos, kw) if namespace == "aten" else None
    first_error = None
    if adapter is not None and (not pos or isinstance(pos[0], TensorVariable) or schema.arguments[0].name != "self"):
        try:
            return tx.call_adapter(adapter, pos, kw, label)
        except Unsupported as e:  # the torch-level signature differs: run the overload itself
            first_error = e
    if schema.is_mutable:  # only ever the Tensor method's in-place rule
        raise first_error or Unsupported(f"{label}: the op mutates its arguments (not captured)")
    adapter, why = fallback_adapter(overload, label)
    if adapter is None:
        raise first_error or Unsupported(f"{label} is not supported ({why})")
    try:
        return tx.call_adapter(adapter, pos, kw, label)
    except Unsupported:
        if first_error is not None:
            raise first_error from None
        raise


def _route_user_op(tx, overload, pos, kw):
    label = f"torch.ops.{_op_name(overload)}"
    if torch.Tag.nondeterministic_seeded in getattr(overload, "tags", ()):
        raise Unsupported(f"{label}: a random op (not captured)")
    adapter, why = custom_ops.custom_op_adapter(overload, label)
    if adapter is None:
        raise Unsupported(f"{label} is not captured: {why}")
    custom_ops.check_written_memory(tx, overload, pos, kw, label)
    return tx.call_adapter(adapter, pos, kw, label)
