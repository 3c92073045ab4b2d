"""The op object and the rule tables keyed by op.

Every transformation owns exactly one table here. The rules themselves are registered next to
the op they belong to (in core.py / prims.py / decompositions.py), so reading one op tells you
everything about it: its meta rule, its eager implementation, its decomposition, its lowering.

A missing rule is a loud error that names the op and the stage (``MissingRule``).
"""
from __future__ import annotations


class MissingRule(NotImplementedError):
    def __init__(self, stage: str, op: "Op"):
        super().__init__(f"[{stage}] no {stage} rule is registered for {op!r}")
        self.stage = stage
        self.op = op


class RuleTable(dict):
    """A dict from Op to rule that raises MissingRule (naming op and stage) on a miss."""

    def __init__(self, stage: str):
        super().__init__()
        self.stage = stage

    def __missing__(self, op):
        raise MissingRule(self.stage, op)

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


class Op:
    """One operator of a vocabulary: ``core`` (what captured graphs hold), ``prim`` (what
    lowering consumes) or a library op (a prim that lowering keeps whole as an extern call).

    Calling an op on real tensors runs its eager implementation. Calling it with a graph
    ``Proxy`` among its arguments records a node instead; that is how decompositions and VJP
    rules written as plain Python build graphs.
    """

    __slots__ = ("name", "namespace", "eager", "library", "random", "doc", "__weakref__")

    def __init__(self, namespace: str, name: str, eager, *, library: bool = False,
                 random: bool = False, doc: str = ""):
        self.namespace = namespace
        self.name = name
        self.eager = eager
        self.library = library
        self.random = random
        self.doc = doc

    @property
    def qualname(self) -> str:
        return f"{self.namespace}.{self.name}"

    def __repr__(self):
        return self.qualname

    def __call__(self, *args, **kwargs):
        from kiln.graph.proxy import active_graph, find_proxy

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
