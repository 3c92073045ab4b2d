"""Graph: an ordered list of Nodes that prints as runnable Python and runs with eager torch."""
from __future__ import annotations

import contextlib
import math
import operator

import torch

from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, Node, flatten_args, map_args
from kiln.graph.proxy import Proxy, pop_active, push_active
from kiln.meta.tensor_meta import WrappedNumberMeta
from kiln.graph import registry
from kiln.graph.registry import META_RULES
from kiln.meta import TensorMeta
from kiln.meta.symbolic import concretize, symbol_values

# Multi-output ops return tuples; consumers pick an element with this op.
getitem = registry.define("graph", "getitem", operator.getitem)


@META_RULES.register(getitem)
def _getitem_meta(tup, index):
    return tup[index]


class Graph:
    def __init__(self, name: str = "forward"):
        self.name = name
        self.nodes: list[Node] = []
        self.constants: dict[str, torch.Tensor] = {}
        self._names: dict[str, int] = {}
        self._placeholder_end = 0  # where the next placeholder goes, if still true (placeholder)
        self._inherited_meta: dict = {}
        # call_hook(target, args, kwargs) -> (args, kwargs) runs before a call is recorded;
        # capture sets it to apply torch.autocast's casts (kiln/capture/autocast.py)
        self.call_hook = None

    # ---------------------------------------------------------------- building
    def _unique_name(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "v"
        if base[0].isdigit() or base in _RESERVED:
            base = "v_" + base
        n = self._names.get(base)
        if n is None:
            self._names[base] = 0
            return base
        while True:
            n += 1
            cand = f"{base}_{n}"
            if cand not in self._names:
                self._names[base] = n
                self._names[cand] = 0
                return cand

    def _add(self, node: Node) -> Node:
        for k, v in self._inherited_meta.items():
            node.meta.setdefault(k, v)
        self.nodes.append(node)
        return node

    def placeholder(self, name: str, meta=None) -> Node:
        node = Node(self, self._unique_name(name), PLACEHOLDER, name)
        if meta is not None:
            node.meta["val"] = meta
        # Placeholders go before every call so the signature reads naturally: after the
        # leading run of placeholders, whose end is remembered (a backward graph has hundreds)
        nodes, idx = self.nodes, self._placeholder_end
        if not (idx <= len(nodes) and (idx == 0 or nodes[idx - 1].op == PLACEHOLDER)
                and (idx == len(nodes) or nodes[idx].op != PLACEHOLDER)
                and (idx == 0 or nodes[0].op == PLACEHOLDER)):
            idx = 0
            while idx < len(nodes) and nodes[idx].op == PLACEHOLDER:
                idx += 1
        nodes.insert(idx, node)
        self._placeholder_end = idx + 1
        return node

    def get_attr(self, name: str, tensor: torch.Tensor) -> Node:
        name = self._unique_name(name)
        self.constants[name] = tensor
        node = Node(self, name, GET_ATTR, name)
        node.meta["val"] = TensorMeta.of(tensor)
        return self._add(node)

    def create_node(self, target, args, kwargs=None, name=None) -> Node:
        node = Node(self, self._unique_name(name or target.name), CALL, target, args, kwargs)
        return self._add(node)

    def call(self, target, args, kwargs=None):
        """Record target(*args, **kwargs) where args may hold Proxies; returns Proxies.

        The node's meta is computed right away by the op's meta rule, so a bad call fails
        here, at the line that made it, with the op named.
        """
        kwargs = kwargs or {}
        if self.call_hook is not None:
            args, kwargs = self.call_hook(target, args, kwargs)
        node_args = _unproxy(args)
        node_kwargs = _unproxy(kwargs)
        node = self.create_node(target, node_args, node_kwargs)
        metas = map_args((node_args, node_kwargs), lambda n: n.meta["val"])
        try:
            node.meta["val"] = META_RULES[target](*metas[0], **metas[1])
        except Exception:
            self.erase(node)
            raise
        return self.wrap_outputs(node)

    def wrap_outputs(self, node: Node):
        val = node.meta["val"]
        if isinstance(val, tuple):
            return tuple(self.call(getitem, (Proxy(node), i)) for i in range(len(val)))
        return Proxy(node)

    def output(self, values) -> Node:
        node = Node(self, "output", OUTPUT, "output", (_unproxy(values),))
        self.nodes.append(node)
        return node

    def erase(self, node: Node):
        assert not node.users, f"cannot erase {node}: it still has users {list(node.users)}"
        for inp in node.inputs():
            inp.users.pop(node, None)
        self.nodes.remove(node)

    def building(self):
        """Make this the graph that argument-less op calls (rand, full) record into."""
        return self.inherit()

    @contextlib.contextmanager
    def inherit(self, **meta):
        """Nodes created inside this block get these meta entries (provenance, stage)."""

        old = self._inherited_meta
        self._inherited_meta = {**old, **meta}
        push_active(self)  # ops called without tensor arguments are recorded here too
        try:
            yield
        finally:
            pop_active()
            self._inherited_meta = old

    # ---------------------------------------------------------------- queries
    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == PLACEHOLDER]

    @property
    def output_node(self) -> Node:
        assert self.nodes and self.nodes[-1].op == OUTPUT, "graph has no output node"
        return self.nodes[-1]

    @property
    def calls(self) -> list[Node]:
        return [n for n in self.nodes if n.op == CALL and n.target is not getitem]

    def ops_count(self) -> int:
        return len(self.calls)

    # ---------------------------------------------------------------- executing
    def run(self, *inputs, sizes=None):
        """The reference executor: interpret every node with the ops' eager torch code.
        ``sizes``: values of symbolic sizes the inputs do not give (a backward graph's)."""
        env: dict[Node, object] = {}
        load = lambda n: env[n]  # noqa: E731
        placeholders = self.placeholders
        if len(inputs) != len(placeholders):
            raise TypeError(f"graph {self.name} takes {len(placeholders)} inputs, got {len(inputs)}")
        for node, value in zip(placeholders, inputs):
            env[node] = value
        # Python numbers held as tensors: inputs (dynamic floats) or made inside (``float(t)``)
        numbers = any(type(n.meta.get("val")) is WrappedNumberMeta for n in self.nodes)
        # symbolic sizes in arguments take the values the real inputs have
        sizes = {**(sizes or {}), **symbol_values([n.meta.get("val") for n in placeholders], inputs)}
        for node in self.nodes:
            if node.op == CALL:
                args = map_args(node.args, load)
                kwargs = map_args(node.kwargs, load)
                if numbers and getattr(node.target, "namespace", None) == "core":
                    args, kwargs = _as_numbers(node, args, kwargs)
                if sizes:
                    args, kwargs = concretize((args, kwargs), sizes)
                try:
                    env[node] = node.target.eager(*args, **kwargs)
                except Exception as e:
                    raise RuntimeError(f"while executing {node.name} = {node.target!r}(...) "
                                       f"in graph {self.name}:\n{self.python()}") from e
            elif node.op == GET_ATTR:
                env[node] = self.constants[node.target]
            elif node.op == OUTPUT:
                return map_args(node.args[0], load)
        raise RuntimeError(f"graph {self.name} has no output node")

    # ---------------------------------------------------------------- printing
    def python(self, annotate: bool = True) -> str:
        """Runnable Python source for this graph (see ``as_function``)."""
        params = ", ".join(n.name for n in self.placeholders)
        lines = [f"def {self.name}({params}):"]
        if annotate:
            for n in self.placeholders:
                if "val" in n.meta:
                    lines.append(f"    # {n.name}: {n.meta['val']}")
        last_source = last_origin = None
        for node in self.nodes:
            if node.op == PLACEHOLDER:
                continue
            if annotate:
                source = node.meta.get("source")
                if source is not None and source != last_source:
                    lines.append(f"    # {source}")
                    last_source = source
                origin = node.meta.get("origin")
                if origin != last_origin:
                    if origin is not None:  # the core op these prims replace
                        lines.append(f"    # {origin}  =>")
                    last_origin = origin
            if node.op == CALL:
                args = [_fmt(a) for a in node.args]
                args += [f"{k}={_fmt(v)}" for k, v in node.kwargs.items()]
                text = f"{node.name} = {_target_expr(node.target)}({', '.join(args)})"
                if annotate and "val" in node.meta:
                    text += f"  # {_fmt_meta(node.meta['val'])}"
                lines.append("    " + text)
            elif node.op == GET_ATTR:
                lines.append(f"    {node.name} = constants[{node.target!r}]")
            elif node.op == OUTPUT:
                lines.append(f"    return {_fmt(node.args[0])}")
        return "\n".join(lines) + "\n"

    def __str__(self):
        return self.python()

    def as_function(self):
        """exec() the printed source and return the function: proof that the printout runs."""
        namespace = {"torch": torch, "core": _OpNamespace("core"), "prims": _OpNamespace("prims"),
                     "graph": _GraphNamespace,
                     "constants": self.constants, "inf": math.inf, "nan": math.nan}
        exec(compile(self.python(), f"<kiln graph {self.name}>", "exec"), namespace)
        return namespace[self.name]


class _GraphNamespace:
    getitem = getitem


class _OpNamespace:
    """``core.add`` in a printed graph: the op of that qualified name, found in the registry
    (the graph sits below the op vocabularies, so it names their ops instead of importing them)."""

    def __init__(self, namespace: str):
        self._namespace = namespace

    def __getattr__(self, name: str):
        try:
            return registry.lookup(self._namespace, name)
        except KeyError:
            raise AttributeError(f"no op {self._namespace}.{name} is defined") from None


_RESERVED = {"torch", "core", "prims", "graph", "constants", "inf", "nan", "def", "return",
             "lambda", "if", "else", "for", "in", "is", "not", "and", "or", "None", "True",
             "False", "class", "import", "from", "as", "with", "pass", "del", "global"}


def _unproxy(obj):
    if isinstance(obj, Proxy):
        return obj.node
    if isinstance(obj, tuple):
        return tuple(_unproxy(x) for x in obj)
    if isinstance(obj, list):
        return [_unproxy(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _unproxy(v) for k, v in obj.items()}
    return obj


def _target_expr(target) -> str:
    return target.qualname if isinstance(target, registry.Op) else repr(target)


def _fmt(a) -> str:
    if isinstance(a, Node):
        return a.name
    if isinstance(a, tuple):
        inner = ", ".join(_fmt(x) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(_fmt(x) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(v)}" for k, v in a.items()) + "}"
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch.device):
        return f"torch.device({str(a)!r})"
    if isinstance(a, float):
        if math.isinf(a):
            return "inf" if a > 0 else "-inf"
        if math.isnan(a):
            return "nan"
    return repr(a)


def _fmt_meta(val) -> str:
    if isinstance(val, tuple):
        return "(" + ", ".join(_fmt_meta(v) for v in val) + ")"
    return repr(val)


def _is_number(a) -> bool:
    return type(a) is Node and type(a.meta.get("val")) is WrappedNumberMeta


def _as_numbers(node, args, kwargs):
    """A core op's operands with the tensors standing for Python floats (``WrappedNumberMeta``)
    as the floats, where the op also has a real tensor operand: torch then promotes them as
    numbers (``half * 0.5`` stays half). Among numbers alone a 0-d float64 tensor computes what
    Python's float arithmetic does, and stays one (a prim takes it as the tensor it is)."""
    operands = [a for a in flatten_args((node.args, node.kwargs)) if type(a) is Node]
    if not any(_is_number(a) for a in operands) or all(_is_number(a) for a in operands):
        return args, kwargs

    def convert(original, value):
        if isinstance(original, (tuple, list)):
            return type(original)(convert(o, v) for o, v in zip(original, value))
        return value.item() if _is_number(original) else value
    return (tuple(convert(o, v) for o, v in zip(node.args, args)),
            {k: convert(node.kwargs[k], v) for k, v in kwargs.items()})
