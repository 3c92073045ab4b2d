"""The op object, its properties, and the rule tables keyed by op.

Every transformation owns exactly one table here. The rules themselves are registered next to
the op they belong to, so reading one op tells you everything about it: its capture spellings,
meta rule, eager implementation, decomposition, VJP rule, lowering, autocast policy and
properties. ``ops/op_exp.py``, ``op_sum.py``, ``op_mm.py``, ``op_add.py`` and the family file
``op_unary_math.py`` hold all of an op's rules in one file; older families still keep their VJP
rules in ``autograd/rules*.py`` and their capture adapters in ``capture/torch_api*.py``.

*Properties* are flags given to ``define(...)`` and read by the stages (``op.recompute``,
``ops_with(recompute=True)``), never name lists kept elsewhere.

*Stage APIs.* This package sits at the bottom of the layers: it imports no stage. A rule that
is written with a stage's helpers (a lowering builds loop-IR values with
``kiln.inductor.lowering``; a capture adapter raises capture's ``Unsupported``) reaches them
through a ``stage_api(name)`` handle, which the stage binds to its module when it is imported
(``bind_stage``). A table entry built from a handle before the stage is bound (``L.pointwise("exp")``
at the op's definition) is a ``Deferred`` recipe, replaced by the real rule when the stage binds,
so a stage reading its table sees only real rules and pays nothing per lookup.

A missing rule is a loud error that names the op and the stage (``MissingRule``).
"""
from __future__ import annotations
from kiln.graph.proxy import active_graph, find_proxy


class MissingRule(NotImplementedError):
    def __init__(self, stage: str, op: "Op"):
        super().__init__(f"[{stage}] no {stage} rule is registered for {op!r}")
        self.stage = stage
        self.op = op


_TABLES: list = []


class RuleTable(dict):
    """A dict from Op (or another key: a torch callable for capture) to rule that raises
    MissingRule (naming op and stage) on a miss."""

    def __init__(self, stage: str):
        super().__init__()
        self.stage = stage
        _TABLES.append(self)

    def __missing__(self, op):
        raise MissingRule(self.stage, op)

    def __setitem__(self, op, rule):
        super().__setitem__(op, _resolve(rule))

    def register(self, *ops):
        def deco(fn):
            for op in ops:
                self[op] = fn
            return fn
        return deco


META_RULES = RuleTable("meta")
DECOMPOSITIONS = RuleTable("decomposition")
LOWERINGS = RuleTable("lowering")
VJP_RULES = RuleTable("vjp")
# core op -> its form in a graph that trains: fn(*proxies) -> Proxy, or None to keep the op
# (attention keeps the state its backward needs). Read with .get: most ops have none.
TRAINING_FORMS = RuleTable("training form")
# Capture spellings declared next to their op (merged into capture/torch_api.py's tables, which
# still hold the older families' entries): torch callable -> adapter, Tensor method name ->
# adapter, operator spelling (dis's argrepr) -> adapter. Adapters take what the user wrote, with
# tensors as graph Proxies, and call core ops.
CAPTURE_FUNCTIONS = RuleTable("capture")
CAPTURE_METHODS = RuleTable("capture")
CAPTURE_OPERATORS = RuleTable("capture")
# Tensor method names whose in-place form (``x.exp_()``, ``torch.exp_``) is the functional
# method plus a write into self (capture/torch_api_inplace.py builds the adapters).
INPLACE_METHODS: list = []


# ------------------------------------------------------------------ stage APIs
class StageAPI:
    """A late-bound handle on a stage's module (``stage_api("lowering")``). Bound: attributes are
    the module's. Unbound: attribute reads and calls record a ``Deferred`` recipe instead."""

    __slots__ = ("stage", "module")

    def __init__(self, stage: str):
        self.stage = stage
        self.module = None

    def __getattr__(self, name):
        if self.module is not None:
            return getattr(self.module, name)
        if name.startswith("__"):  # introspection (copy, pickle, inspect) is not a recipe
            raise AttributeError(name)
        return Deferred(self, ((name, None),))

    def __repr__(self):
        return f"stage_api({self.stage!r})"


class Deferred:
    """``api.a.b(*args)`` read before ``api``'s stage was bound: the steps to take once it is."""

    __slots__ = ("api", "steps")

    def __init__(self, api: StageAPI, steps: tuple):
        self.api = api
        self.steps = steps  # (attribute name, None) or (None, (args, kwargs))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Deferred(self.api, self.steps + ((name, None),))

    def __call__(self, *args, **kwargs):
        return Deferred(self.api, self.steps + ((None, (args, kwargs)),))

    def resolve(self):
        if self.api.module is None:
            raise RuntimeError(f"[registry] {self!r} used before its stage was imported")
        value = self.api.module
        for name, call in self.steps:
            value = getattr(value, name) if name is not None else value(*call[0], **call[1])
        return value

    def __repr__(self):
        text = self.api.stage
        for name, call in self.steps:
            text += f".{name}" if name is not None else "(...)"
        return f"<deferred {text}>"


_STAGE_APIS: dict[str, StageAPI] = {}


def stage_api(stage: str) -> StageAPI:
    """The handle through which op rules use stage ``stage``'s module (bound by the stage)."""
    api = _STAGE_APIS.get(stage)
    if api is None:
        api = _STAGE_APIS[stage] = StageAPI(stage)
    return api


def bind_stage(stage: str, module) -> None:
    """Called by a stage's module when it is imported: binds its handle and replaces every
    table entry recorded through it by the real rule."""
    api = stage_api(stage)
    api.module = module
    for table in _TABLES:
        for key, rule in list(dict.items(table)):
            if isinstance(rule, Deferred) and rule.api.module is not None:
                dict.__setitem__(table, key, rule.resolve())


def _resolve(rule):
    if isinstance(rule, Deferred) and rule.api.module is not None:
        return rule.resolve()
    return rule


# ------------------------------------------------------------------ ops and their properties
# Values of the properties (keyword arguments of ``define``):
#   library        kept whole by lowering as an extern call (cuBLAS/MKL, torch)
#   random         draws random numbers: CSE never merges two calls, the partitioner never
#                  recomputes one
#   pointwise      an elementwise op: each output element reads the same element of its operands
#   recompute      cheap to recompute inside the backward's fused kernels (the min-cut
#                  partitioner may recompute it instead of saving it): pointwise ops, views,
#                  index transforms; never GEMMs, reductions, normalizations or random ops
#   view           the result aliases the first operand: "shape" (the same elements, re-indexed:
#                  reshape, permute, expand...), "index" (some of them: select, slice) or "alias"
#                  (the same memory: detach, view_dtype)
#   eager_layout   eager's result layout: "contiguous" whatever the inputs' layouts, "follows"
#                  (contiguous when every input is), None (not known to capture)
#   differentiable False for ops with no gradient (comparisons, integer ops, creation ops,
#                  backward ops themselves); True ops must have a VJP rule
#   layout_dependent  its lowering reads its operands' strides, so lowering realizes them in
#                  the layout their metas promise (conv, sdpa)
#   reduction      a reduction prim's kind in the loop IR ("sum", "max", "argmax" ...)
#   fresh_result   a library prim whose result is always a new tensor, never a view of an
#                  operand (the wrapper may reuse its operands' buffers)
#   exact_layout   a library prim whose result always has its meta's strides (torch.mm / bmm
#                  return a fresh row-major result): the wrapper skips ensure_layout
#   wrapper_call   for a library prim: ``f(inputs, arg_texts, kwarg_texts, bound=...)`` -> the
#                  wrapper's call text, or None for the eager function's (``extern_<name>(...)``);
#                  an op whose eager function only normalizes its arguments calls the library
#                  itself. ``bound(buffer name)`` gives the (shape, stride) of the tensor the
#                  wrapper holds under that name (mm reads a weight's transpose as linear)
#   autocast       {device type: policy} under torch.autocast (ops/autocast.py's LOWER, FP32,
#                  PROMOTE, BANNED); ops without one are looked up by name in autocast.py's tables
_DEFAULTS = {"library": False, "random": False, "pointwise": False, "recompute": False, "view": None,
             "eager_layout": None, "differentiable": True, "layout_dependent": False, "autocast": None,
             "reduction": None, "fresh_result": False, "exact_layout": False, "wrapper_call": None}


class Op:
    """One operator of a vocabulary: ``core`` (what captured graphs hold), ``prim`` (what
    lowering consumes) or a library op (a prim that lowering keeps whole as an extern call).

    Calling an op on real tensors runs its eager implementation. Calling it with a graph
    ``Proxy`` among its arguments records a node instead; that is how decompositions and VJP
    rules written as plain Python build graphs.
    """

    __slots__ = ("name", "namespace", "eager", "doc", "__weakref__") + tuple(_DEFAULTS)

    def __init__(self, namespace: str, name: str, eager, *, doc: str = "", **props):
        self.namespace = namespace
        self.name = name
        self.eager = eager
        self.doc = doc
        unknown = set(props) - set(_DEFAULTS)
        if unknown:
            raise TypeError(f"define({namespace}.{name}): unknown properties {sorted(unknown)}")
        for prop, default in _DEFAULTS.items():
            setattr(self, prop, props.get(prop, default))

    @property
    def qualname(self) -> str:
        return f"{self.namespace}.{self.name}"

    def __repr__(self):
        return self.qualname

    def __call__(self, *args, **kwargs):
        proxy = find_proxy(args, kwargs)
        if proxy is not None:
            return proxy.graph_builder.call(self, args, kwargs)
        graph = active_graph()  # an op with no tensor arguments (rand, full) inside a graph build
        if graph is not None:
            return graph.call(self, args, kwargs)
        return self.eager(*args, **kwargs)

    def __reduce__(self):
        # Ops are singletons; pickling refers back to the registry.
        return (lookup, (self.namespace, self.name))


_OPS: dict[tuple[str, str], Op] = {}


def define(namespace: str, name: str, eager, **kw) -> Op:
    key = (namespace, name)
    if key in _OPS:
        raise ValueError(f"op {namespace}.{name} is defined twice")
    op = Op(namespace, name, eager, **kw)
    _OPS[key] = op
    return op


def lookup(namespace: str, name: str) -> Op:
    return _OPS[(namespace, name)]


def all_ops(namespace: str | None = None):
    return [op for (ns, _), op in _OPS.items() if namespace is None or ns == namespace]


def ops_with(namespace: str | None = None, **props) -> frozenset:
    """The ops whose properties have these values: ``ops_with("core", recompute=True)``. Stages
    take their op sets from here once their vocabulary is defined (at import)."""
    unknown = set(props) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"ops_with: unknown properties {sorted(unknown)}")
    return frozenset(op for op in all_ops(namespace) if all(getattr(op, k) == v for k, v in props.items()))


# The properties every elementwise core op shares (``define("core", name, eager, **POINTWISE)``).
POINTWISE = {"pointwise": True, "recompute": True, "eager_layout": "follows"}
