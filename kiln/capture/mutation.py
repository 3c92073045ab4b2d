"""Functionalization: in-place ops and aliasing during capture, write-back after the graph runs.

Captured graphs are functional. Capture keeps eager's aliasing on the side:

* a ``Storage`` is one piece of memory: its current whole value (a graph value), a version
  bumped by every write, and whether its root is a graph input;
* a ``TensorVariable`` that is a view carries an ``Alias``: its storage and the chain of view
  steps (``ViewStep``: select, slice, permute, reshape, ...) from the storage's root to it.

A write to a variable (``mutate``) computes the new value of the variable, then scatters it back
through the inverse of each view step (``select_scatter``, ``slice_scatter``, reshape back,
inverse permute, ...) into a new value of the whole storage, and bumps the version. A variable
whose storage changed since it last read it replays its view chain on the storage's new value
the next time it is read (``TensorVariable.proxy`` calls ``refresh``). So writing through a view
updates the base and every other live view, and writing the base updates views taken earlier.

Which results are views is read off the graph: after each capture-table call, the nodes between
an argument and a result are walked back; a result reached only through view ops is a view of
that argument (``wrap_outputs``). Where eager's aliasing depends on strides capture does not know
exactly (``reshape``/``view``/``contiguous`` of a computed tensor, whose eager layout may differ
from kiln's meta; results of fallback nodes), the step is *uncertain*: reading such a view after
its storage changed, or reading any other alias after writing through such a view, is a graph
break, never a guess.

Inputs that share memory with each other are one storage (``mutation_alias.GroupStorage``:
a synthetic flat base, each input a view chain of it), formed in ``storage_of``.

At the end of capture (``finalize``), each mutated storage whose root is a graph input adds its
final value as an extra graph output (a group: each root member's), and ``graph.input_mutations`` lists (input index, output
index) pairs. ``WritebackGraph`` (wrapped around every compiled graph by
``pipeline.compile_graph``) copies those outputs into the inputs after the graph runs.
"""
from __future__ import annotations

import torch

from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.torch_api_inplace import Rebinds, Writes, _fill_value
from kiln.graph import Proxy, getitem
from kiln.graph.node import CALL, PLACEHOLDER, Node, flatten_args
from kiln.ops import core
from kiln.ops.core_fallback import returns_fresh
from kiln.ops.core_views import _view_strides
from kiln.ops.registry import META_RULES


class Storage:
    __slots__ = ("value", "version", "from_input", "root", "root_node", "poisoned", "refused")

    def __init__(self, value: Proxy, root, from_input: bool):
        self.value = value          # the whole storage's current value
        self.version = 0
        self.from_input = from_input  # the root is a graph input (its strides are eager's)
        self.root = root            # the TensorVariable that is the whole storage
        self.root_node = value.node  # its first value (the placeholder, for an input)
        self.poisoned = None        # reason string once the aliasing is no longer known
        self.refused = None         # why a write into this input is refused (it shares memory)

    def root_layout(self):
        """The eager TensorMeta of the whole storage, or None where it is not known."""
        return eager_layout(self.root_node)

    def input_tensors(self, tx):
        """The input tensors whose memory this is."""
        return [t for v, _, t in tx._tensor_inputs.values() if v is self.root]


class Alias:
    __slots__ = ("storage", "chain")

    def __init__(self, storage: Storage, chain: tuple):
        self.storage = storage
        self.chain = chain


def _inverse_reshape(base, new, *args, **kwargs):
    return core.reshape(new, tuple(base.shape))


def _inverse_permute(base, new, dims):
    dims = [d % base.ndim for d in dims]
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d] = i
    return core.permute(new, tuple(inv))


def _inverse_expand(base, new, shape):
    if tuple(new.shape) != tuple(base.shape):
        raise EagerRaises("in-place update of an expanded tensor: more than one element refers to "
                          "the same memory location (eager raises)")
    return new


# view op (``view=...`` on its define) -> the write that puts a new value of the view back into
# its base: inverse(base value, new view value, *the view's own args) -> new base value
SCATTERS = {
    core.select: lambda base, new, dim, index: core.select_scatter(base, new, dim, index),
    core.slice: lambda base, new, dim=0, start=None, end=None, step=1:
        core.slice_scatter(base, new, dim, start, end, step),
    core.unsqueeze: _inverse_reshape,
    core.squeeze: _inverse_reshape,
    core.reshape: _inverse_reshape,
    core.permute: _inverse_permute,
    core.transpose: lambda base, new, d0, d1: core.transpose(new, d0, d1),
    core.expand: _inverse_expand,
    core.detach: lambda base, new: new,
    core.view_dtype: lambda base, new, dtype: core.view_dtype(new, base.dtype),
}


class ViewStep:
    """One view op from a parent value to a child, replayable and invertible."""
    __slots__ = ("op", "args", "kwargs", "uncertain")

    def __init__(self, op, args, kwargs, uncertain: str | None = None):
        self.op, self.args, self.kwargs = op, args, kwargs
        self.uncertain = uncertain  # why eager's aliasing is not known here, or None

    def apply(self, value):
        if self.op is None:
            return value
        return self.op(value, *self.args, **self.kwargs)

    def scatter(self, base, new):
        return SCATTERS[self.op](base, new, *self.args, **self.kwargs)

    def __repr__(self):
        return f"{self.op}{self.args}" + (" (uncertain)" if self.uncertain else "")


# ---------------------------------------------------------------- reading
def eager_meta(var):
    """var's TensorMeta with eager's exact strides when capture knows them, else None. In-place
    writes never change a tensor's strides, so a view's are its root's, through its chain."""
    a = var.alias
    if a is None:
        return eager_layout(var.proxy.node)
    if any(s.uncertain or s.op is None for s in a.chain):
        return None
    meta = a.storage.root_layout()
    for s in a.chain:
        if meta is None:
            return None
        meta = META_RULES[s.op](meta, *s.args, **s.kwargs)
    return meta


def eager_layout(node):
    """The eager TensorMeta (exact strides) of a graph value, or None where kiln's meta may
    differ from eager's layout (kiln's computed results are contiguous; eager's follow their
    inputs)."""
    memo = _layout_memo(node.graph)
    if node in memo:
        return memo[node]
    meta = None
    val = node.meta.get("val")
    if node.op == PLACEHOLDER or node.op == "get_attr":
        meta = val
    elif node.op == CALL and node.target.view and isinstance(node.args[0], Node):
        src = eager_layout(node.args[0])
        if src is not None:
            if node.target is core.reshape and _view_strides(src.shape, src.stride, val.shape) is None:
                meta = val  # eager copies into a contiguous tensor
            else:
                meta = META_RULES[node.target](src, *node.args[1:], **node.kwargs)
    elif node.op == CALL and node.target.eager_layout == "contiguous":  # whatever the inputs' layouts
        meta = val
    elif node.op == CALL and node.target.eager_layout == "follows" and val is not None and val.is_contiguous():
        ins = [a for a in _flat(node.args) + _flat(node.kwargs) if isinstance(a, Node)]
        if all((m := eager_layout(a)) is not None and m.is_contiguous() for a in ins):
            meta = val
    memo[node] = meta
    return meta


def _flat(x):
    return list(flatten_args(x))


def _layout_memo(graph) -> dict:
    memo = graph.__dict__.get("_eager_layouts")
    if memo is None:
        memo = graph.__dict__["_eager_layouts"] = {}
    return memo


def _remember_layout(new: Proxy, meta):
    """The value written into a tensor has that tensor's eager layout."""
    _layout_memo(new.node.graph).setdefault(new.node, meta)


def promise_written_layouts(graph):
    """A result whose value an in-place write made (``t = torch.empty_strided(...); t[:] = v;
    return t``) has the written tensor's strides in eager, which the write's value node
    (contiguous in kiln's meta) does not carry: the graph promises them for its outputs
    (``pipeline.promised_strides``), where capture knew them (:func:`_remember_layout`)."""
    memo = _layout_memo(graph)
    promised = []
    for o in graph.output_node.args[0]:
        val = o.meta.get("val") if isinstance(o, Node) else None
        known = memo.get(o) if isinstance(o, Node) else None
        differs = (known is not None and hasattr(val, "stride") and known.shape == val.shape
                   and any(n != 1 and a != b for n, a, b in zip(val.shape, known.stride, val.stride)))
        promised.append(tuple(known.stride) if differs else None)
    if any(p is not None for p in promised) and getattr(graph, "promised_output_strides", None) is None:
        own = [tuple(o.meta["val"].stride) if isinstance(o, Node) and hasattr(o.meta.get("val"), "stride")
               else None for o in graph.output_node.args[0]]
        graph.promised_output_strides = [p or o for p, o in zip(promised, own)]


def refresh(var):
    """Recompute var's value from its storage (the storage changed since var last read it)."""
    a = var.alias
    st = a.storage
    if st.poisoned:
        raise Unsupported(st.poisoned)
    for step in a.chain:
        if step.uncertain:
            raise Unsupported(f"reading a view after its memory was written in place: {step.uncertain}")
    value = st.value
    for step in a.chain:
        value = step.apply(value)
    var._proxy = value
    var._seen = st.version


def storage_of(tx, var) -> Alias:
    if var.alias is None:
        node = var._proxy.node
        from_input = node.op == PLACEHOLDER and var.source is not None
        refused = None
        if from_input:  # an input sharing memory with other inputs: one storage for them all
            from kiln.capture.mutation_alias import input_alias
            refused = input_alias(tx, var)
            if isinstance(refused, Alias):
                return refused
        st = Storage(var._proxy, var, from_input)
        st.refused = refused
        tx.storages.append(st)
        var.alias = Alias(st, ())
        var._seen = 0
    return var.alias


# ---------------------------------------------------------------- results of capture-table calls
def wrap_outputs(tx, out, args, kwargs, py_args, py_kwargs, name: str):
    """Wrap an adapter's result as Variables, recording views and applying writes."""
    from kiln.capture.values import TensorVariable

    by_proxy = []  # (proxy object the adapter received, its Variable)
    by_node = {}
    for v, p in list(zip(args, py_args)) + [(kwargs[k], py_kwargs[k]) for k in kwargs]:
        for var, proxy in _tensor_pairs(v, p):
            by_proxy.append((proxy, var))
            by_node.setdefault(proxy.node, var)
    if isinstance(out, Rebinds):
        return _rebind(tx, out, by_proxy, by_node, name)
    if isinstance(out, Writes):
        for target, new in out.updates:
            var = next((v for p, v in by_proxy if p is target), None)
            if var is None or not isinstance(var, TensorVariable):
                raise Unsupported(f"{name}: writes into a tensor that is not an argument")
            mutate(tx, var, new, name)
        result = out.result
        for p, v in by_proxy:
            if result is p:
                return v
        out = result
        if not getattr(tx, "grad_enabled", True) and isinstance(out, Proxy) and out.meta.requires_grad:
            out = core.detach(out)  # made under no_grad
    return _wrap(tx, out, by_node, name)


def _rebind(tx, out: Rebinds, by_proxy, by_node, name):
    """An in-place view op: the argument's Variable takes the view's value and alias chain.
    An input's shape would change for the caller too, which kiln does not write back."""
    from kiln.capture.values import TensorVariable

    var = next((v for p, v in by_proxy if p is out.target), None)
    if var is None or not isinstance(var, TensorVariable):
        raise Unsupported(f"{name}: changes the shape of a tensor that is not an argument")
    if var.source is not None or storage_of(tx, var).storage.from_input:
        raise Unsupported(f"{name}: changing the shape of an input (or a view of one) in place "
                          "is not supported")
    view = _wrap_proxy(tx, out.view, by_node, name)
    if view is not var:
        var._proxy, var.alias, var._seen = view._proxy, view.alias, view._seen
    return var


def _tensor_pairs(v, p):
    from kiln.capture.values import TensorVariable, _Sequence

    if isinstance(v, TensorVariable) and isinstance(p, Proxy):
        yield v, p
    elif isinstance(v, _Sequence) and isinstance(p, (list, tuple)):
        for vi, pi in zip(v.items, p):
            yield from _tensor_pairs(vi, pi)


def _wrap(tx, out, by_node, name):
    from kiln.capture.values import ListVariable, TupleVariable

    if isinstance(out, Proxy):
        return _wrap_proxy(tx, out, by_node, name)
    if isinstance(out, tuple) and not isinstance(out, torch.Size):
        return TupleVariable([_wrap(tx, o, by_node, name) for o in out])
    if isinstance(out, list):
        return ListVariable([_wrap(tx, o, by_node, name) for o in out])
    return tx.wrap_result(out)


def _wrap_proxy(tx, out: Proxy, by_node, name):
    from kiln.capture.values import TensorVariable

    steps = []
    node = out.node
    base_var = by_node.get(node)
    while base_var is None:
        if not (node.op == CALL and node.target.view and isinstance(node.args[0], Node)):
            if node.op == CALL and node.target is core.fallback:
                return _fallback_result(tx, out, node, by_node)
            if node.op == CALL and node.target is getitem and node.args[0].target is core.fallback:
                return _fallback_result(tx, out, node.args[0], by_node)  # one of several results
            return tx.wrap_result(out)  # a new tensor
        steps.append(node)
        node = node.args[0]
        base_var = by_node.get(node)

    meta = eager_meta(base_var)
    if not steps:
        if name == "Tensor.contiguous":
            if meta is None:
                return _view_var(tx, out, base_var, [ViewStep(None, (), {}, _uncertain("contiguous"))])
            if any(n != 1 and a != b for n, a, b in zip(meta.shape, meta.stride, out.meta.stride)):
                # laid out otherwise in eager than the rule saw (it returned its argument for
                # being contiguous in the format asked for): eager copies
                return TensorVariable(core.contiguous(out))
        return base_var  # the call returned its argument (or an alias of all of it)
    chain = []
    for n in reversed(steps):
        uncertain = None
        args, kwargs = tuple(n.args[1:]), dict(n.kwargs)
        if n.target is core.reshape:
            if meta is None:
                uncertain = _uncertain("reshape/view")
            elif _view_strides(meta.shape, meta.stride, n.meta["val"].shape) is None:
                return TensorVariable(out)  # eager copies: a new tensor (views of it are new too)
        if meta is not None and uncertain is None:
            meta = META_RULES[n.target](meta, *args, **kwargs)
        else:
            meta = None
        chain.append(ViewStep(n.target, args, kwargs, uncertain))
    return _view_var(tx, out, base_var, chain)


def _uncertain(what):
    return (f"{what} of a computed tensor may alias it or copy it in eager (it depends on strides "
            "kiln does not track)")


def _view_var(tx, out, base_var, chain):
    from kiln.capture.values import TensorVariable

    base = storage_of(tx, base_var)
    var = TensorVariable(out)
    var.alias = Alias(base.storage, base.chain + tuple(chain))
    var._seen = base.storage.version
    return var


def _fallback_result(tx, out, node, by_node):
    """A fallback op may return a view in eager: link it to its first tensor argument with an
    uncertain step, so reading it after that argument changes is a break."""
    from kiln.capture.values import TensorVariable

    if isinstance(node.args[0], str) and returns_fresh(node.args[0]):
        return TensorVariable(out)  # its schema returns new tensors (topk, sort, cumsum...)
    for a in node.args[1:]:
        if isinstance(a, Node) and a in by_node:
            why = f"{node.args[0]} (a fallback op) may return a view of its input in eager"
            return _view_var(tx, out, by_node[a], [ViewStep(None, (), {}, why)])
    return TensorVariable(out)


# ---------------------------------------------------------------- writing
def mutate(tx, var, new: Proxy, what: str):
    """Write new (var's whole new value) into var, and so into its storage."""
    old = var.proxy
    if not isinstance(new, Proxy):
        raise Unsupported(f"{what}: the new value is not a tensor")
    if tuple(new.shape) != tuple(old.shape):
        raise EagerRaises(f"{what}: the result's shape {list(new.shape)} differs from the tensor's "
                          f"{list(old.shape)} (eager raises)")
    if new.dtype != old.dtype:
        if not torch.can_cast(new.dtype, old.dtype):
            raise EagerRaises(f"{what}: result type {new.dtype} can't be cast to the tensor's "
                              f"{old.dtype} (eager raises)")
        new = core.to_dtype(new, old.dtype)
    if not getattr(tx, "grad_enabled", True) and new.meta.requires_grad:
        if old.meta.requires_grad and not _no_grad_leaf_write(tx, var):
            # eager keeps the gradient path to the tensor's earlier history; kiln would drop it
            raise Unsupported(f"{what}: in-place update under no_grad of a tensor that requires "
                              "grad is not supported")
        new = core.detach(new)
    alias = storage_of(tx, var)
    st = alias.storage
    if st.poisoned:
        raise Unsupported(st.poisoned)
    _check_input_write(tx, st, what)
    uncertain = next((s.uncertain for s in alias.chain if s.uncertain), None)
    if uncertain is not None:
        # Whether this write reaches the base is not known: the variable becomes its own
        # storage, and every other alias of the old one is unreadable from now on.
        st.poisoned = f"{what} wrote through a view whose aliasing is not known: {uncertain}"
        st.version += 1
        own = Storage(new, var, False)
        tx.storages.append(own)
        var.alias = Alias(own, ())
        var._proxy, var._seen = new, 0
        return
    values = [st.value]
    for step in alias.chain[:-1]:
        values.append(step.apply(values[-1]))
    cur = new
    for step, base in zip(reversed(alias.chain), reversed(values)):
        cur = step.scatter(base, cur)
    _remember_layout(new, eager_meta(var))
    _remember_layout(cur, st.root_layout())
    st.value = cur
    st.version += 1
    var._proxy, var._seen = new, st.version


def _no_grad_leaf_write(tx, var) -> bool:
    """An input leaf that requires grad written whole under no_grad (an optimizer's
    ``param.add_(...)``): it has no history to keep, so the written value is detached. The leaf
    still requires grad in eager while kiln's new value does not, so a later read with grad
    enabled is refused (``refuse_grad_read_of_written_leaf``)."""
    alias = storage_of(tx, var)
    st = alias.storage
    if alias.chain or not st.from_input or not all(t.is_leaf for t in st.input_tensors(tx)):
        return False
    tx.__dict__.setdefault("_no_grad_written_leaves", set()).add(id(st))
    return True


def refuse_grad_read_of_written_leaf(tx, args, kwargs):
    """Called for each op: with grad enabled, reading a leaf written under no_grad would lose
    the gradient eager gives it (``_no_grad_leaf_write``)."""
    written = tx.__dict__.get("_no_grad_written_leaves")
    if not written or not tx.grad_enabled:
        return
    from kiln.capture.values import TensorVariable
    todo = [*args, *kwargs.values()]
    while todo:
        v = todo.pop()
        if isinstance(v, TensorVariable):
            if v.alias is not None and id(v.alias.storage) in written:
                raise Unsupported("a parameter written under no_grad is read with grad enabled in "
                                  "the same compiled call (its gradient would be lost)")
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
        elif hasattr(v, "items") and isinstance(getattr(v, "items"), list):
            todo.extend(v.items)


def _check_input_write(tx, st: Storage, what: str):
    if st.refused:
        raise Unsupported(f"{what}: in-place update of an input that shares memory with another "
                          f"input: {st.refused}")
    if not st.from_input:
        return
    for t in st.input_tensors(tx):
        if getattr(tx, "grad_enabled", True) and t.requires_grad and t.is_leaf:
            raise EagerRaises(f"{what}: in-place update of a leaf tensor that requires grad, or of "
                              "memory it shares (eager raises RuntimeError)")
    if st.root_node is None:
        return
    meta = st.root_node.meta["val"]
    if st.version == 0 and any(s == 0 and n > 1 for n, s in zip(meta.shape, meta.stride)):
        raise EagerRaises(f"{what}: in-place update of an input with overlapping memory (stride 0; "
                          "eager raises)")


def setitem(tx, target, key, value):
    """``target[key] = value``: basic indices write through a view; index tensors and lists
    of ints then write with index_put, a bool mask with a masked where
    (``torch_api_index.put``)."""
    from kiln.capture import torch_api
    from kiln.capture import torch_api_index
    from kiln.capture.values import ConstantVariable, TensorVariable

    py_key = tx.unwrap(key, "tensor item assignment")
    py_value = tx.unwrap(value, "tensor item assignment")
    if isinstance(value, ConstantVariable) and not isinstance(py_value, (int, float, bool)):
        raise Unsupported(f"assigning a {type(py_value).__name__} into a tensor is not supported")
    entries = None
    if torch_api_index.has_advanced(py_key):
        py_key, entries = torch_api_index.split_key(target.proxy.ndim, py_key)
        key = ConstantVariable(py_key)
    view = target
    if entries is None or not torch_api_index.all_full(py_key):
        view = tx.call_adapter(torch_api.TENSOR_METHODS["__getitem__"], [target, key], {},
                               "tensor item assignment")
    if not isinstance(view, TensorVariable):
        raise Unsupported("tensor item assignment: the indexed result is not a tensor")
    try:
        if entries is None:
            new = _fill_value(view.proxy, py_value)
        else:
            new = torch_api_index.put(view.proxy, entries, py_value)
    except (Unsupported, IndexError):
        raise
    except Exception as e:
        raise Unsupported(f"tensor item assignment failed during capture: {type(e).__name__}: {e}") from e
    mutate(tx, view, new, "tensor item assignment")


# ---------------------------------------------------------------- end of capture
def finalize(tx, ret, proxies: list, at_break: bool = False):
    """Add each mutated input's final value to the graph outputs; return the write-back plan:
    (input_mutations: [(input index, output index)], returned_inputs: [(output index, input index)],
    copied: [input index]: inputs the backward must not see written), or None. ``ret`` is what
    the function returns, or the tensors live at a graph break (a list): there, a view would
    reach the resume function as a separate tensor, so it is refused. Inputs sharing memory
    (``mutation_alias.GroupStorage``) write back each root member."""
    from kiln.capture.mutation_alias import GroupStorage, check_and_guard, member_alias

    if at_break:
        _refuse_observable_views(list(_output_vars(ret)), stored=len(proxies) > len(ret))
    placeholders = [n for n in tx.graph.nodes if n.op == PLACEHOLDER]
    mutated = [st for st in tx.storages if st.version and st.from_input]
    if not mutated:
        return None
    index_of = {n: i for i, n in enumerate(placeholders)}
    for st in mutated:
        if st.poisoned:
            raise Unsupported(st.poisoned)
    plain = [st for st in mutated if not isinstance(st, GroupStorage)]
    groups = [st for st in mutated if isinstance(st, GroupStorage)]
    check_and_guard(tx, plain, groups)
    mutations, copied = [], []
    for st in plain:
        mutations.append((index_of[st.root_node], len(proxies)))
        proxies.append(st.value)
        copied.append(index_of[st.root_node])
    for g in groups:
        mutations += g.writeback(index_of, proxies)
        copied += [index_of[m.placeholder.node] for m in g.members]
    returned = []
    roots = {id(st.root): st for st in plain}
    for i, var in enumerate(_output_vars(ret)):
        st = roots.get(id(var))
        if st is not None and var.alias.storage is st and var.alias.chain == ():
            returned.append((i, index_of[st.root_node]))
        elif var.alias is not None and var.alias.storage in groups:
            m = var.alias.storage.member_of(var)
            if m is not None:  # an input in a written group, returned as itself
                returned.append((i, index_of[m.placeholder.node]))
    return mutations, returned, copied


def _refuse_observable_views(live: list, stored: bool):
    """A view live at a graph break reaches the resume function as a tensor of its own (a
    prefix-graph output). That is only observable when something else after the break can see
    the same memory: an input's (the caller holds it), another live tensor on the same storage
    (a write through one must show in the other), or tensors the prefix stores into Python
    state (``stored``: not tracked here). A view of an intermediate seen by nobody else, such
    as ``h = x.view(b, t, -1)`` live across the break, is passed as it is. Views the glue takes
    again from their base (``resume_values.view_rebuild``) are not among ``live``: their base is."""
    from kiln.capture.mutation_alias import member_alias
    if stored:
        live_views = [v for v in live if v.alias is not None and v.alias.chain]
        if live_views:
            raise Unsupported("a view of another tensor is live across a graph break (the resume "
                              "function would get a copy, not a view)")
    per_storage: dict = {}
    for var in live:
        if var.alias is not None:
            per_storage.setdefault(id(var.alias.storage), set()).add(id(var))
    for var in live:
        a = var.alias
        if a is None or not a.chain or member_alias(var):
            continue
        shared = len(per_storage[id(a.storage)]) > 1 or a.storage.root in live
        if a.storage.from_input or shared:
            raise Unsupported("a view of another tensor is live across a graph break (the resume "
                              "function would get a copy, not a view)")


def _output_vars(v):
    from kiln.capture.values import DictVariable, TensorVariable, _Sequence

    if isinstance(v, TensorVariable):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _output_vars(x)
    elif isinstance(v, _Sequence):
        for x in v.items:
            yield from _output_vars(x)
    elif isinstance(v, DictVariable):
        for x in v.items.values():
            yield from _output_vars(x)


# ---------------------------------------------------------------- after the graph runs
class WritebackGraph:
    """A compiled graph plus its input write-backs: calls the graph, copies each mutated input's
    new value into the input tensor, and returns the user's outputs (a returned mutated input is
    the input tensor itself, as in eager)."""

    def __init__(self, inner, input_mutations, returned_inputs, num_user_outputs, copied=None):
        self.inner = inner
        self.input_mutations = list(input_mutations)
        self.returned_inputs = list(returned_inputs)
        self.num_user_outputs = num_user_outputs
        # inputs whose memory the write-back changes (those sharing it with a written one too)
        self.copied = list(copied if copied is not None else (i for i, _ in self.input_mutations))

    def __getattr__(self, name):  # kernel_count, wrapper_source, ... of the compiled graph
        return getattr(self.__dict__["inner"], name)

    def __call__(self, *inputs):
        inputs = list(inputs)
        grad = torch.is_grad_enabled()
        given = list(inputs)
        if grad:
            # A backward may read the inputs (saved by KilnFunction, or by torch's own ops on
            # the eager backend): the graph gets copies, so the write-back cannot change them.
            saved = getattr(self.inner, "saved_inputs", None)
            records = hasattr(self.inner, "graph")  # EagerGraph: torch ops record autograd
            saved = set(i for i in saved or () if i is not None)
            for i in self.copied:
                if records or i in saved:
                    inputs[i] = inputs[i].clone()
        outs = self.inner(*inputs)
        for i, o in self.input_mutations:
            t, new = given[i], outs[o]
            # a leaf that requires grad is only written under no_grad (capture refuses the rest:
            # eager raises), an optimizer's step: its copy is not recorded either
            if grad and t.requires_grad and not t.is_leaf:
                t.copy_(new)  # recorded by autograd, as eager's in-place op was
            else:
                with torch.no_grad():
                    t.copy_(new)
        user = list(outs[:self.num_user_outputs])
        for o, i in self.returned_inputs:
            user[o] = given[i]
        return tuple(user)


def with_writeback(compiled, graph):
    plan = getattr(graph, "input_mutations", None)
    if not plan:
        return compiled
    mutations, returned = plan[:2]
    copied = plan[2] if len(plan) > 2 else None
    n_out = len(graph.output_node.args[0]) if hasattr(graph, "output_node") else None
    n_user = (n_out if n_out is not None else _num_outputs(graph)) - len(mutations)
    return WritebackGraph(compiled, mutations, returned, n_user, copied)


def _num_outputs(graph):
    for n in reversed(graph.nodes):
        if n.op == "output":
            return len(n.args[0])
    raise ValueError("graph has no output node")
