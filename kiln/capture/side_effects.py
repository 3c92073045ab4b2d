"""Python state the traced code mutates, replayed after the compiled graph runs.

While tracing, a write to state that outlives the call (an attribute of a module or of an object
reached from the inputs, an item of a list or dict reached from the inputs, a global, a closure
cell) updates the tracker, so later reads in the same trace see the new value, and is recorded
here. When the capture ends, each recorded write becomes one step of a replay plan. The tensors
the writes store are added to the graph's outputs, so the replay stores the real output tensors.

After every call of the compiled graph, ``rebuild(outputs, L, G)`` (tracer.py) runs the plan:

- ``setattr``: ``<target>.<name> = value``;
- ``list``: ``<target>[:] = items`` (the list keeps its identity); ``deque``: ``clear()`` then
  ``extend(items)``;
- ``dict``: ``<target>.clear(); <target>.update(items)``;
- ``global``: ``globals_dict[name] = value``;
- ``cell``: ``<cell>.cell_contents = value``;
- ``call``: ``fn(*args, **kwargs)`` with constant arguments, in trace order: calls whose only
  effect is output (logging, ``warnings.warn``; values_stdlib.py), made for real on every call
  as in eager instead of being traced.

Targets are source expressions over ``L`` and ``G`` (evaluated on each call, so an argument list
is the caller's list of that call) or, for globals, the module's globals dict itself.

Values are rebuilt from specs (tracer.py's output specs, extended here with namedtuples, objects
made during the trace, and values with a source, which are fetched again).
"""
from __future__ import annotations

import collections
import copy
import dataclasses

from kiln.capture.dict_keys import build_keyed_dict, has_tensor_keys, key_spec
from kiln.capture.errors import Unsupported


@dataclasses.dataclass
class _AttrWrites:
    target: object            # the Variable written to (has a source)
    values: dict              # name -> Variable


class SideEffects:
    def __init__(self):
        self.attr_writes: dict[int, _AttrWrites] = {}
        self.containers: dict[int, object] = {}      # id(tracker) -> mutated list/dict tracker
        self.global_writes: dict[int, tuple] = {}    # id(globals) -> (globals dict, {name: Variable})
        self.cells: dict[int, object] = {}           # id(cell tracker) -> CellVariable
        self.trackers: dict[int, tuple] = {}         # id(real object) -> (object, tracker)
        self.calls: list[tuple] = []                 # (fn, args, kwargs): output-only calls
        self.asserts: list[tuple] = []               # (tensor, error args, expect): tensor_asserts.py

    # ---------------------------------------------------------------- one tracker per object
    def tracker_of(self, value):
        """The tracker already made for this mutable object in this trace, if any."""
        hit = self.trackers.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    def remember(self, value, tracker):
        self.trackers[id(value)] = (value, tracker)  # holding value keeps its id unique
        return tracker

    # ---------------------------------------------------------------- attributes
    @staticmethod
    def _real(var):
        obj = getattr(var, "module", None)
        return obj if obj is not None else getattr(var, "value", None)

    def load_attr(self, var, name):
        writes = self.attr_writes.get(id(self._real(var)))
        return None if writes is None else writes.values.get(name)

    def store_attr(self, var, name, value):
        if var.source is None:
            raise Unsupported(f"setting attribute {name!r} on {var}, which was reached without a "
                              "source, is not supported")
        real = self._real(var)
        writes = self.attr_writes.setdefault(id(real), _AttrWrites(var, {}))
        writes.values[name] = value

    # ---------------------------------------------------------------- lists and dicts
    def mutate(self, container):
        """A list or dict tracker is about to change; one reached from the inputs is replayed."""
        if container.source is not None:
            self.containers[id(container)] = container

    # ---------------------------------------------------------------- globals and cells
    def load_global(self, globals_, name):
        hit = self.global_writes.get(id(globals_))
        return None if hit is None else hit[1].get(name)

    def store_global(self, globals_, name, value):
        self.global_writes.setdefault(id(globals_), (globals_, {}))[1][name] = value

    def store_cell(self, cell):
        if cell.cell_source is None:
            raise Unsupported("assigning a free variable of a function reached without a source")
        self.cells[id(cell)] = cell

    def record_call(self, fn, args, kwargs):
        """A call made for real after the graph runs (its arguments are Python constants)."""
        self.calls.append((fn, tuple(args), dict(kwargs)))

    def empty(self) -> bool:
        return not (self.attr_writes or self.containers or self.global_writes or self.cells
                    or self.calls or self.asserts)

    # ---------------------------------------------------------------- the replay plan
    def plan(self, spec_of) -> list:
        """Steps ``(kind, target, ...specs)``; ``spec_of(variable)`` makes a value spec (and
        adds the tensors it holds to the graph outputs)."""
        # the run-time asserts first: a failing one raises before any write is replayed
        steps = [("assert", spec_of(t), args, expect) for t, args, expect in self.asserts]
        for w in self.attr_writes.values():
            for name, value in w.values.items():
                steps.append(("setattr", _accessor(w.target.source), name, spec_of(value)))
        for c in self.containers.values():
            if isinstance(c.items, dict):
                keys = list(c.items)
                if has_tensor_keys(keys):  # tensor keys read from their sources (dict_keys.py)
                    steps.append(("keyed_dict", _accessor(c.source), [key_spec(k) for k in keys],
                                  [spec_of(v) for v in c.items.values()]))
                    continue
                steps.append(("dict", _accessor(c.source), keys,
                              [spec_of(v) for v in c.items.values()]))
            elif c.python_type() is collections.deque:  # no slice assignment (values_deque.py)
                steps.append(("deque", _accessor(c.source), [spec_of(v) for v in c.items]))
            else:
                steps.append(("list", _accessor(c.source), [spec_of(v) for v in c.items]))
        for globals_, names in self.global_writes.values():
            for name, value in names.items():
                steps.append(("global", globals_, name, spec_of(value)))
        for cell in self.cells.values():
            if cell.contents is None:
                raise Unsupported("deleting a free variable is not supported")
            steps.append(("cell", _accessor(cell.cell_source), spec_of(cell.contents)))
        steps.extend(("call", fn, args, kwargs) for fn, args, kwargs in self.calls)
        return steps


def _accessor(source):
    expr = source.expr()
    fn = eval(compile(f"lambda L, G: {expr}", f"<kiln side effect {expr}>", "eval"),  # noqa: S307
              {"__builtins__": __builtins__})
    fn.expr = expr
    return fn


def replay(steps, build, L, G):
    """Run the plan after a call: ``build(spec)`` makes a value from the call's outputs."""
    for step in steps:
        kind = step[0]
        if kind == "assert":  # eager's `assert t, message` (tensor_asserts.py)
            if bool(build(step[1])) is not step[3]:
                raise AssertionError(*step[2])
        elif kind == "setattr":
            setattr(step[1](L, G), step[2], build(step[3]))
        elif kind == "list":
            step[1](L, G)[:] = [build(s) for s in step[2]]
        elif kind == "deque":
            target = step[1](L, G)
            items = [build(s) for s in step[2]]  # built first: an item may be read from target
            target.clear()
            target.extend(items)
        elif kind in ("dict", "keyed_dict"):
            target = step[1](L, G)
            values = [build(s) for s in step[3]]
            keys = step[2] if kind == "dict" else [build(s) for s in step[2]]
            # dict's own methods: a subclass's overrides ran in the trace; an OrderedDict keeps
            # its order in a list of its own, which dict's methods would leave behind
            kind = collections.OrderedDict if isinstance(target, collections.OrderedDict) else dict
            kind.clear(target)
            kind.update(target, zip(keys, values))
        elif kind == "global":
            step[1][step[2]] = build(step[3])
        elif kind == "cell":
            step[1](L, G).cell_contents = build(step[2])
        elif kind == "call":
            step[1](*step[2], **step[3])


# ---------------------------------------------------------------- value specs beyond tracer's
def extra_spec(v, proxies, spec_of):
    """Specs for values the tracer's output spec does not know; None when unsupported."""
    from kiln.capture.values_python import (DictDataclassVariable, NamedTupleVariable,
                                            ObjectVariable, SetVariable)
    if isinstance(v, NamedTupleVariable):
        return ("namedtuple", v.cls, [spec_of(x, proxies) for x in v.items])
    if isinstance(v, SetVariable):
        return ("const", v.as_python())
    if isinstance(v, DictDataclassVariable):
        return ("call", v.cls, {k: spec_of(x, proxies) for k, x in v.values.items()})
    if isinstance(v, ObjectVariable) and v.value is None:
        return ("object", v.cls, {k: spec_of(x, proxies) for k, x in v.attrs.items()})
    if v.source is not None:
        return ("source", _accessor(v.source))
    if getattr(v, "local", False) and hasattr(v, "snapshot"):  # a module made in the trace
        return ("fresh", v.snapshot())
    return None


def build_extra(spec, build, L, G):
    kind = spec[0]
    if kind == "namedtuple":
        from kiln.capture.values_python import make_named_tuple
        return make_named_tuple(spec[1], [build(s) for s in spec[2]])
    if kind == "object":
        obj = object.__new__(spec[1])
        for k, s in spec[2].items():
            object.__setattr__(obj, k, build(s))
        return obj
    if kind == "call":
        return spec[1](**{k: build(s) for k, s in spec[2].items()})
    if kind == "keyed_dict":  # a dict keyed by input tensors (dict_keys.py)
        return build_keyed_dict(spec, build)
    if kind == "dict_subclass":  # a dict subclass made in the trace (values_dict.py)
        from kiln.capture.values_dict import build_dict_subclass
        return build_dict_subclass(spec, build)
    if kind == "defaultdict":  # values_defaultdict.py
        from kiln.capture.values_defaultdict import build_defaultdict
        return build_defaultdict(spec, build)
    if kind == "fresh":  # a module made in the trace: each call gets its own (module_new.py)
        return copy.deepcopy(spec[1])
    if kind == "source":
        if L is None:
            raise RuntimeError("kiln: a captured value must be fetched again, but rebuild got no L")
        return spec[1](L, G)
    raise AssertionError(f"unknown output spec {kind!r}")


__all__ = ["SideEffects", "replay", "extra_spec", "build_extra"]
