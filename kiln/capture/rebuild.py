"""What a capture returns and writes, rebuilt after each call: value specs for the graph's
outputs and Python constants (``_output_spec``), the ``rebuild(outputs, L)`` function that
makes the returned value and replays Python-state writes (``_make_rebuild``), and ints that
depend on dynamic symbols (a counter's ``n + 1``), evaluated per call from the call's inputs."""
from __future__ import annotations

import collections

import torch

from kiln.capture.dict_keys import has_tensor_keys, keyed_dict_spec
from kiln.capture.rebuild_made import MADE_KINDS, build_made, made_value_spec
from kiln.capture.side_effects import _accessor, build_extra, extra_spec, replay
from kiln.capture.values_deque import DequeVariable, deque_spec
from kiln.capture.values_defaultdict import DefaultDictVariable, defaultdict_spec
from kiln.capture.values_dict import DictSubclassVariable, dict_subclass_spec
from kiln.capture.values import (ConstantVariable, DictVariable, ListVariable, TensorVariable,
                                 TupleVariable, Variable)
from kiln.capture.errors import Unsupported
from kiln.meta.symbolic import SymInt, py
from kiln.meta.tensor_meta import WrappedNumberMeta


def _output_spec(v: Variable, proxies: list):
    if isinstance(v, TensorVariable):
        proxies.append(v.proxy)
        if type(v.proxy.meta) is WrappedNumberMeta:  # a Python float (capture/dynamic_floats.py)
            return ("number", len(proxies) - 1)
        if v.made_leaf:  # requires_grad_() under no_grad in the trace (made_leaves.py)
            return ("leaf", len(proxies) - 1)
        if v.source is None:  # computed in the frame: eager's result is a new tensor object
            return ("new", len(proxies) - 1, bool(getattr(v.proxy.meta, "requires_grad", False)))
        return ("tensor", len(proxies) - 1)
    if isinstance(v, ConstantVariable):
        if isinstance(v.value, SymInt):
            spec = _symint_spec(v.value)
            if spec is not None:
                return spec
        return ("const", _concrete(v.value))
    if isinstance(v, TupleVariable):
        return ("tuple", [_output_spec(x, proxies) for x in v.items])
    if isinstance(v, DequeVariable):  # a deque, not a list: before ListVariable, its base
        return deque_spec(v, proxies, _output_spec)
    if isinstance(v, (ListVariable, DictVariable)) and v.source is not None:
        # a list or dict from the inputs: the caller's own object (its writes are replayed on
        # it), as eager returns it, not a copy
        return ("source", _accessor(v.source))
    if isinstance(v, ListVariable):
        return ("list", [_output_spec(x, proxies) for x in v.items])
    if isinstance(v, DefaultDictVariable):  # keeps its type and factory (tensor keys too)
        return defaultdict_spec(v, proxies, _output_spec)
    if isinstance(v, DictSubclassVariable):  # keeps its class (the caller's own object if an input)
        return dict_subclass_spec(v, proxies, _output_spec)
    if isinstance(v, DictVariable) and has_tensor_keys(v.items):
        return keyed_dict_spec(v, proxies, _output_spec)
    if isinstance(v, DictVariable) and v.python_type() is collections.OrderedDict:
        return ("odict", list(v.items), [_output_spec(x, proxies) for x in v.items.values()])
    if isinstance(v, DictVariable):
        return ("dict", list(v.items), [_output_spec(x, proxies) for x in v.items.values()])
    spec = made_value_spec(v, proxies, _output_spec)  # functions made in the trace
    if spec is None:
        spec = extra_spec(v, proxies, _output_spec)
    if spec is not None:
        return spec
    raise Unsupported(f"returning {v} is not supported")


def _symint_spec(value):
    """("symint", python expr, {symbol name: source expr}) for a returned or written int that
    depends on symbols (a dynamic int counter's ``n + 1``): evaluated per call from the
    call's own inputs instead of specializing on the traced value; None when a symbol has no
    source to read it from."""
    env, expr = value.env, value.expr
    reads = {}
    for sym in expr.free_symbols:
        src = env.sources.get(sym)
        if src is None:
            return None
        reads[sym.name] = src
    return ("symint", py(expr), reads)


def _symint_reads(spec, out: dict) -> dict:
    """Every symbol read of the ``symint`` specs inside ``spec``."""
    if isinstance(spec, tuple) and spec and spec[0] == "symint":
        out.update(spec[2])
    elif isinstance(spec, tuple) and spec and spec[0] == "const":
        pass  # a Python constant, whatever it holds
    elif isinstance(spec, tuple) and spec and spec[0] == "made_function":
        _symint_reads(spec[4:], out)  # its defaults and cells; not its code and globals
    elif isinstance(spec, (tuple, list)):
        for x in spec:
            _symint_reads(x, out)
    elif isinstance(spec, dict):
        for x in spec.values():
            _symint_reads(x, out)
    return out


def _concrete(value):
    """A returned Python value with symbolic sizes specialized (guarded) to their ints."""
    if isinstance(value, SymInt):
        return int(value)
    if isinstance(value, tuple) and any(isinstance(v, SymInt) for v in value):
        return tuple(int(v) if isinstance(v, SymInt) else v for v in value)
    return value


def _set_grad_after(rebuild, mode: bool):
    def rebuild_then_set_grad(outputs, L=None):
        out = rebuild(outputs, L)
        torch._C._set_grad_enabled(mode)
        return out
    rebuild_then_set_grad.spec = getattr(rebuild, "spec", None)
    return rebuild_then_set_grad


def _make_rebuild(spec, globals_=None):
    """``rebuild(outputs, L=None)``: the returned value, after replaying Python-state writes
    (``("effects", spec, steps)``, side_effects.py); L is the call's frame locals."""
    # symbols of dynamic ints the result or the replayed writes use: read once per call,
    # before any write (a counter's new value is computed from its value at the call)
    reads = {name: compile(src, f"<kiln symbol {name}>", "eval")
             for name, src in _symint_reads(spec, {}).items()}
    symbols: dict = {}

    def build(s, outputs, L, memo):
        kind = s[0]
        if kind == "tensor" or kind == "new":
            return outputs[s[1]]
        if kind == "const":
            return s[1]
        if kind == "number":
            return outputs[s[1]].item()
        if kind == "leaf":
            return outputs[s[1]].requires_grad_()
        if kind == "symint":
            return int(eval(s[1], {"__builtins__": {}}, symbols))  # noqa: S307
        if kind == "tuple":
            return tuple(build(x, outputs, L, memo) for x in s[1])
        if kind == "list":
            return [build(x, outputs, L, memo) for x in s[1]]
        if kind == "dict":
            return {k: build(x, outputs, L, memo) for k, x in zip(s[1], s[2])}
        if kind == "odict":
            return collections.OrderedDict((k, build(x, outputs, L, memo)) for k, x in zip(s[1], s[2]))
        if kind in MADE_KINDS:  # functions made in the trace: cells shared through memo
            return build_made(s, lambda x: build(x, outputs, L, memo), memo)
        return build_extra(s, lambda x: build(x, outputs, L, memo), L, globals_)

    def rebuild(outputs, L=None):
        if reads:
            scope = {"torch": torch}
            for name, code in reads.items():
                symbols[name] = eval(code, scope, {"L": L, "G": globals_})  # noqa: S307
        memo: dict = {}  # cells made for this call's functions (rebuild_made.py)
        if spec[0] == "effects":
            result = build(spec[1], outputs, L, memo)
            replay(spec[2], lambda x: build(x, outputs, L, memo), L, globals_)
            return result
        return build(spec, outputs, L, memo)

    rebuild.spec = spec
    return rebuild


def new_tensor_outputs(spec) -> dict:
    """{output position: requires_grad} of the tensors a rebuild spec returns that the frame
    computed (``("new", i, requires_grad)``): eager hands back a new tensor object for each."""
    found: dict = {}

    def walk(s):
        if type(s) is tuple and s and s[0] == "new" and len(s) == 3 and type(s[1]) is int:
            found[s[1]] = s[2]
        elif isinstance(s, (tuple, list)):
            for x in s:
                walk(x)
        elif isinstance(s, dict):
            for x in s.values():
                walk(x)
    walk(spec)
    return found


def fresh_aliases(rebuild, positions: dict):
    """``rebuild`` with the outputs at ``positions`` (graph outputs that are the call's own
    input objects, for values the frame computed as a view or detach of them) replaced by new
    alias objects, as eager returns: ``x.detach()`` must not hand back ``x`` itself (it would
    require grad), and ``requires_grad_()`` on a returned ``x[0:]`` must not flip the input's."""
    def rebuild_fresh(outputs, L=None):
        outs = list(outputs)
        for i, requires_grad in positions.items():
            t = outs[i]
            outs[i] = t.view_as(t) if requires_grad and t.requires_grad else t.detach()
        return rebuild(outs, L)
    rebuild_fresh.spec = getattr(rebuild, "spec", None)
    return rebuild_fresh
