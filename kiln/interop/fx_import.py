"""An FX ``GraphModule`` (Dynamo's captured graph) as a kiln Graph of core ops.

This module and its package are the only places in kiln that read ``torch.fx`` or Dynamo
objects (DESIGN.md section 5). It holds no op table of its own: each FX node is replayed
through capture's ``Tracer`` exactly as the bytecode interpreter replays a call, so the
capture table (``kiln/capture/torch_api*.py``), ``torch.ops`` routing, fallback nodes, views
and in-place writes (``kiln/capture/mutation.py``) and no_grad regions all behave as they do
under ``kiln.compile``:

* ``placeholder``: a graph input. A tensor's sizes and strides come from Dynamo's fake tensor
  (``node.meta["example_value"]``): each of Dynamo's size symbols becomes one kiln symbol, so
  kiln specializes nothing Dynamo left symbolic. A ``SymInt`` placeholder whose symbol no
  tensor size gives is passed to the graph through a storage-less carrier tensor of shape
  ``(n, 0)``, as capture passes a dynamic Python int;
* ``call_function`` / ``call_method``: the callee's capture tracker is called (a torch
  function, an ``aten`` overload, an ``operator`` or a builtin);
* ``get_attr``: a tensor of the GraphModule, a graph input read from it on every call (a
  parameter keeps its gradient, a buffer its in-place updates);
* ``call_module``: the submodule is inlined as capture inlines any module call;
* ``output``: the returned structure, rebuilt per call by capture's ``rebuild``.

Sources are expressions over ``L = {"self": gm, "args": args}`` (the backend's call), so
capture's ``make_fetch`` builds the function that picks the graph inputs out of a call.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import re

import sympy
import torch

from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, IntCarrierSource, ItemSource, LocalSource, make_fetch
from kiln.capture.mutation import finalize
from kiln.capture.rebuild import _make_rebuild, _output_spec
from kiln.capture.tracer import Tracer
from kiln.capture.values import (ConstantVariable, DictVariable, ListVariable, TensorVariable,
                                 TupleVariable, Variable)
from kiln.graph import Proxy
from kiln.meta import TensorMeta
from kiln.meta.symbolic import SymInt, int_or_expr, py, size_tuple

# operator.* -> the spelling capture's binary_op / unary_op take
BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
          operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
          operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.lshift: "<<",
          operator.rshift: ">>", operator.lt: "<", operator.le: "<=", operator.gt: ">",
          operator.ge: ">=", operator.eq: "==", operator.ne: "!="}
BINARY.update({getattr(operator, f"i{fn.__name__.strip('_')}"): sym + "="
               for fn, sym in list(BINARY.items())
               if hasattr(operator, f"i{fn.__name__.strip('_')}") and sym[0] not in "<>=!"})
UNARY = {operator.neg: "-", operator.pos: "+", operator.invert: "~", operator.abs: "abs"}


@dataclasses.dataclass
class ImportedGraph:
    graph: object          # kiln Graph of core ops
    fetch: object          # fetch(L) -> the graph's inputs
    rebuild: object        # rebuild(outputs, L) -> what the GraphModule returns
    shape_env: object      # kiln ShapeEnv, or None when every size is static
    autocast_devices: tuple  # ambient torch.autocast at import: the graph holds its casts
    grad_after: bool | None  # grad mode the GraphModule leaves set, where it changes it
    static_inputs: list    # (index, shape, stride) of tensor inputs without a fake tensor
    value_inputs: list     # (index, value) of one-element tensor inputs read with .item()


class FxImporter:
    """Replays one GraphModule's nodes through a capture Tracer."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, name: str):
        self.gm = gm
        self.examples = list(example_inputs)
        self.tx = Tracer(name)
        self.tx.root_globals = {}
        self._node = None  # the FX node being imported: where a shape guard was decided
        self.tx.shape_env.location = lambda: provenance(self._node) if self._node is not None else ""
        self.env: dict = {}        # FX node -> Variable
        self.symbols: dict = {}    # Dynamo's sympy symbol -> kiln's expression
        self.static_inputs: list = []  # (index, shape, stride) of inputs Dynamo did not describe
        self.value_inputs: list = []   # (index, value) of one-element inputs read as numbers
        self.placeholders: list = []

    # ---------------------------------------------------------------- the walk
    def run(self) -> ImportedGraph:
        tx = self.tx
        grad_at_entry = tx.grad_enabled
        nodes = list(self.gm.graph.nodes)
        placeholders = self.placeholders = [n for n in nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.examples):
            raise Unsupported(f"{len(placeholders)} placeholders but {len(self.examples)} example inputs")
        # tensor sizes first: a SymInt placeholder of a size some tensor has needs no input
        for i, node in enumerate(placeholders):
            if isinstance(self.examples[i], torch.Tensor):
                self._map_tensor_symbols(node, i)
        ret = None
        for node in nodes:
            self._node = node
            with tx.graph.inherit(source=provenance(node)):
                try:
                    if node.op == "placeholder":
                        self.env[node] = self._placeholder(node, placeholders.index(node))
                    elif node.op == "output":
                        ret = self._var(node.args[0])
                    else:
                        self.env[node] = self._call(node)
                except Unsupported as e:
                    filename, lineno, line = location(node)
                    e.locate(filename, lineno, line)
                    if not e.reason.startswith("FX node"):
                        e.reason = f"FX node {node.name} ({node.op} {_target_name(node)}): {e.reason}"
                        e.args = (e.reason,)
                    raise
        return self._finish(ret, grad_at_entry)

    def _finish(self, ret, grad_at_entry) -> ImportedGraph:
        tx = self.tx
        proxies: list = []
        spec = _output_spec(ret, proxies)
        tx.graph.input_mutations = finalize(tx, ret, proxies)
        tx.graph.output(tuple(proxies))
        autocast_devices = tx.autocast.finish(tx.graph, at_break=False)
        _, fetch = make_fetch(tx.input_sources, {})
        env = tx.shape_env if tx.shape_env.hints else None
        tx._tensor_inputs.clear()  # the import outlives the call: it holds none of its tensors
        tx.shape_env.location = None  # later stages' guards have no FX node
        return ImportedGraph(tx.graph, fetch, _make_rebuild(spec), env, autocast_devices,
                             tx.grad_enabled if tx.grad_enabled != grad_at_entry else None,
                             self.static_inputs, self.value_inputs)

    # ---------------------------------------------------------------- placeholders
    def _placeholder(self, node, index: int) -> Variable:
        example = self.examples[index]
        source = ItemSource(LocalSource("args"), index)
        if isinstance(example, torch.Tensor):
            meta = self._tensor_meta(node, index)
            return self._input(example, meta, source, node.name)
        fake = node.meta.get("example_value", example)
        if isinstance(fake, torch.SymInt):
            expr = fake.node.expr
            if isinstance(expr, sympy.Symbol) and expr not in self.symbols:
                hint = _hint(example)
                sym = self.tx.shape_env.create_size(hint, source.expr(), duck=False)
                self.symbols[expr] = sympy.Integer(sym) if isinstance(sym, int) else sym.expr
                if isinstance(sym, SymInt):  # no tensor has this size: a carrier input
                    meta = TensorMeta((sym, 0), (1, 1), torch.uint8, torch.device("cpu"), False)
                    self.tx.graph.placeholder(f"{node.name}_int", meta)
                    self.tx.input_sources.append(IntCarrierSource(source))
            return ConstantVariable(self._kiln_size(expr, f"placeholder {node.name}"))
        raise Unsupported(f"a {type(example).__name__} graph input is not supported "
                          "(tensors and SymInts are)")

    def _input(self, t: torch.Tensor, meta: TensorMeta, source, name: str) -> TensorVariable:
        tx = self.tx
        seen = tx._tensor_inputs.get(id(t))
        if seen is not None:  # the same tensor reached twice (get_attr of an input's tensor)
            return seen[0]
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(t).__name__} is not supported")
        node = tx.graph.placeholder(name, meta)
        var = TensorVariable(Proxy(node), type(t), source)
        tx._var_of_node[node] = var
        tx._tensor_inputs[id(t)] = (var, source, t)  # mutation tracking reads the real tensor
        tx.input_sources.append(source)
        return var

    def _map_tensor_symbols(self, node, index: int):
        """Kiln symbols for the Dynamo symbols that are a whole size or stride of this input."""
        fake = node.meta.get("example_value")
        if fake is None:
            return
        t = self.examples[index]
        src = ItemSource(LocalSource("args"), index).expr()
        env = self.tx.shape_env
        for kind, dynamo, real in (("size", fake.shape, t.shape), ("stride", fake.stride(), t.stride())):
            for d, (s, hint) in enumerate(zip(dynamo, real)):
                if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol) \
                        and s.node.expr not in self.symbols:
                    make = env.create_size if kind == "size" else env.create_stride
                    sym = make(int(hint), f"{src}.{kind}({d})", **({"duck": False} if kind == "size" else {}))
                    self.symbols[s.node.expr] = sympy.Integer(sym) if isinstance(sym, int) else sym.expr

    def _tensor_meta(self, node, index: int) -> TensorMeta:
        t = self.examples[index]
        fake = node.meta.get("example_value")
        if not isinstance(fake, torch.Tensor):
            # a GraphModule not from Dynamo (torch.fx.symbolic_trace): static sizes, checked
            # on every call since no Dynamo guard covers them
            self.static_inputs.append((index, tuple(t.shape), tuple(t.stride())))
            return TensorMeta.of(t)
        what = f"placeholder {node.name}"
        shape = [self._kiln_size(s, what) for s in fake.shape]
        stride = [self._kiln_size(s, what) for s in fake.stride()]
        return TensorMeta(shape, stride, t.dtype, t.device, t.requires_grad)

    def _kiln_size(self, s, what: str):
        """Dynamo's size (an int, a SymInt or its sympy expression) over kiln's symbols."""
        if isinstance(s, int):
            return s
        expr = s.node.expr if isinstance(s, torch.SymInt) else s
        unknown = [x for x in expr.free_symbols if x not in self.symbols]
        if unknown:
            raise Unsupported(f"{what}: size {expr} uses symbols {unknown} that no input gives")
        out = sympy.sympify(expr).xreplace(self.symbols)
        if any(type(a).__module__.startswith("torch") for a in sympy.preorder_traversal(out)):
            raise Unsupported(f"{what}: size {expr} uses torch's own sympy functions")
        out = int_or_expr(out)
        return out if isinstance(out, int) else SymInt.make(out, self.tx.shape_env)

    # ---------------------------------------------------------------- calls
    def _call(self, node) -> Variable:
        tx = self.tx
        if node.op == "get_attr":
            return self._get_attr(node.target)
        args = [self._var(a) for a in node.args]
        kwargs = {k: self._var(v) for k, v in node.kwargs.items()}
        target = node.target
        if node.op == "call_method":
            if target == "item" and len(args) == 1 and not kwargs:
                return self._item(node, args[0])
            return args[0].getattr(tx, target).call(tx, args[1:], kwargs)
        if node.op == "call_module":
            module = self.gm.get_submodule(target)
            return tx.wrap(module, _attr_source(target)).call(tx, args, kwargs)
        if node.op != "call_function":
            raise Unsupported(f"FX op {node.op!r} is not supported")
        special = _SPECIAL.get(target)
        if special is not None:
            return special(self, args, kwargs)
        if target in BINARY and len(args) == 2 and not kwargs:
            return tx.binary_op(BINARY[target], *args)
        if target in UNARY and len(args) == 1 and not kwargs:
            return tx.unary_op(UNARY[target], *args)
        if target is operator.getitem:
            return tx.getitem(*args)
        if target is operator.setitem and isinstance(args[0], TensorVariable) and not kwargs:
            tx.setitem(*args)  # functionalized like capture's STORE_SUBSCR (mutation.setitem)
            return ConstantVariable(None)
        return tx.wrap(target, None).call(tx, args, kwargs)

    def _item(self, node, var) -> Variable:
        """``.item()`` of a one-element graph input: how Dynamo passes a float it left
        unspecialized (a module's ``eps``, a dropout ``p``). Kiln's ops want Python numbers
        there, so the value is a constant of this variant, checked on every call."""
        index = self._input_index(var)
        if index is None or var.proxy.meta.numel() != 1:
            raise Unsupported("Tensor.item() of a computed tensor (a data-dependent value)")
        value = self.examples[index].item()
        self.value_inputs.append((index, value))
        return ConstantVariable(value)

    def _input_index(self, var):
        for i, node in enumerate(self.placeholders):
            if self.env.get(node) is var:
                return i
        return None

    def _set_grad_enabled(self, args, kwargs) -> Variable:
        """``torch._C._set_grad_enabled``: the edges of a ``with torch.no_grad():`` region."""
        self.tx.grad_enabled = bool(args[0].as_python())
        return ConstantVariable(None)

    def _enter_autocast(self, args, kwargs) -> Variable:
        """Dynamo's ``with torch.autocast(...)``: a region of capture's autocast state, whose
        casts become explicit ``to_dtype`` nodes (kiln/capture/autocast.py)."""
        device, dtype, enabled, _cache = [a.as_python() for a in args] + [None] * (4 - len(args))
        return ConstantVariable(self.tx.autocast.enter(device, True if enabled is None else enabled, dtype))

    def _exit_autocast(self, args, kwargs) -> Variable:
        self.tx.autocast.exit(args[0].as_python())
        return ConstantVariable(None)

    def _get_attr(self, target: str) -> Variable:
        value = operator.attrgetter(target)(self.gm)
        source = _attr_source(target)
        if isinstance(value, torch.Tensor):
            return self._input(value, TensorMeta.of(value), source, target.replace(".", "_"))
        return self.tx.wrap(value, source)

    def _var(self, x) -> Variable:
        """An FX argument (nodes inside lists, tuples, dicts and slices) as a Variable."""
        if isinstance(x, torch.fx.Node):
            return self.env[x]
        if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
            items = [self._var(v) for v in x]
            return ListVariable(items) if isinstance(x, list) else TupleVariable(items)
        if isinstance(x, dict):
            return DictVariable({k: self._var(v) for k, v in x.items()})
        if isinstance(x, slice):
            parts = [self._var(p).as_python() for p in (x.start, x.stop, x.step)]
            return ConstantVariable(slice(*parts))
        if isinstance(x, torch.Tensor):
            raise Unsupported("a tensor constant inside the FX graph's arguments")
        return self.tx.wrap_constant(x)


def _python_math(fn):
    """torch's symbolic-number helpers (``torch.sym_max``, ``torch._sym_sqrt`` ...) on Python
    numbers and kiln SymInts: plain Python arithmetic."""
    def call(importer, args, kwargs):
        if kwargs or any(isinstance(a, TensorVariable) for a in args):
            raise Unsupported(f"{fn.__name__} of a tensor")
        return ConstantVariable(fn(*[a.as_python() for a in args]))
    return call


def _size(importer, args, kwargs):
    """``torch.Size([s0, s1, 96])`` in Dynamo's graph: a shape that stays symbolic (torch.Size
    itself would turn kiln's SymInts into ints, specializing them)."""
    if kwargs or len(args) > 1:
        raise Unsupported("torch.Size with more than one argument")
    items = args[0].as_python() if args else ()
    return ConstantVariable(size_tuple(tuple(items)))


def _sym_sqrt(x):
    return math.sqrt(x)


# call_function targets with a meaning of their own here (not a tensor op)
_SPECIAL = {
    torch._C._set_grad_enabled: FxImporter._set_grad_enabled,
    torch.amp.autocast_mode._enter_autocast: FxImporter._enter_autocast,
    torch.amp.autocast_mode._exit_autocast: FxImporter._exit_autocast,
    torch.Size: _size,
    # torch's API-usage telemetry (transformers' masks call it): no value depends on it
    torch._C._log_api_usage_once: lambda importer, args, kwargs: ConstantVariable(None),
}
for _fn, _py in ((getattr(torch, "sym_max", None), max), (getattr(torch, "sym_min", None), min),
                 (getattr(torch, "sym_float", None), float), (getattr(torch, "sym_int", None), int),
                 (getattr(torch, "sym_not", None), operator.not_),
                 (getattr(torch, "_sym_sqrt", None), _sym_sqrt)):
    if _fn is not None:
        _SPECIAL[_fn] = _python_math(_py)


def _attr_source(target: str):
    source = LocalSource("self")
    for part in target.split("."):
        source = AttrSource(source, part)
    return source


def _hint(example) -> int:
    if isinstance(example, torch.SymInt):
        hint = example.node.hint
        if hint is None:
            raise Unsupported(f"SymInt input {example} has no hint (an unbacked size)")
        return int(hint)
    return int(example)


def _target_name(node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t)
    return f"{mod}.{name}" if mod and mod != "builtins" else name


_FRAME = re.compile(r'File "(.*)", line (\d+), in .*\n\s*(.*)')


def location(node) -> tuple:
    """(filename, lineno, source line) of the user code that made an FX node (its stack trace's
    innermost frame), else the node's name."""
    trace = node.meta.get("stack_trace") or ""
    found = _FRAME.findall(trace)
    if found:
        filename, lineno, line = found[-1]
        return filename, int(lineno), line.strip()
    return "<fx>", 0, f"{node.name} = {node.op} {_target_name(node)}"


def provenance(node) -> str:
    filename, lineno, line = location(node)
    return f"{filename}:{lineno}: {line}"


def symbol_reads(shape_env) -> dict:
    """kiln symbol -> the expression over L that reads its value from a call."""
    return {sym: f"({src})" for sym, src in shape_env.sources.items()}


def guard_check(shape_env, static_inputs=(), value_inputs=()):
    """``check(L) -> bool``: kiln's own shape guards (what its stages decided about the sizes,
    beyond what Dynamo guards) and the sizes of inputs no fake tensor described, or None when
    there is nothing to check."""
    lines = shape_env.guard_lines(symbol_reads(shape_env)) if shape_env is not None else []
    for i, shape, stride in static_inputs:
        lines.append(f"L['args'][{i}].shape == {shape!r} and L['args'][{i}].stride() == {stride!r}")
    for i, value in value_inputs:
        lines.append(f"L['args'][{i}].item() == {value!r}")
    if not lines:
        return None
    source = "def check(L):\n    return " + " and ".join(f"({g})" for g in lines) + "\n"
    namespace = {"torch": torch}
    exec(compile(source, "<kiln interop guards>", "exec"), namespace)  # noqa: S102
    check = namespace["check"]
    check.source = source
    return check


__all__ = ["FxImporter", "ImportedGraph", "guard_check", "location", "py"]
