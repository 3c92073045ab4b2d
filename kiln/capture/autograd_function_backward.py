"""The training half of ``MyFunction.apply`` (see autograd_function.py): the user's ``backward``
traced into a graph of its own, and the ``core.autograd_function`` node that makes it the
region's gradient (kiln/ops/core_autograd_function.py).

The backward is traced by the same tracer, with its graph swapped for a fresh one whose
placeholders are the ctx's saved values and one gradient per output slot, grad mode off and
autocast off (as eager's engine runs it, at ``backward()``), and Python state read-only. Afterwards nothing may point out of that
graph: a tensor the backward reaches other than through ctx (a module's weight, a forward value
kept in a closure) would be a graph input or a forward value, and is a graph break instead.
"""
from __future__ import annotations

import re

import torch

from kiln.capture import mutation
from kiln.capture.autocast import AutocastState
from kiln.capture.errors import Unsupported
from kiln.capture.mutation import ViewStep
from kiln.capture.values import ConstantVariable, DictVariable, ListVariable, TensorVariable, \
    TupleVariable
from kiln.graph.graph import Graph
from kiln.graph.proxy import Proxy
from kiln.meta.symbolic import same_shape
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import core
from kiln.ops.core_autograd_function import CustomFunction, register
from kiln.ops.vjp_utils import broadcasts_to


def overrides(cls, name) -> bool:
    """``cls`` defines its own ``name`` (not torch.autograd.Function's)."""
    own, base = getattr(cls, name), getattr(torch.autograd.Function, name)
    return getattr(own, "__func__", own) is not getattr(base, "__func__", base)


def is_tensor(v) -> bool:
    """A tensor argument or result (a Python number held in the graph is not one)."""
    return isinstance(v, TensorVariable) and not getattr(v, "python_float", False)


def holds_tensor(v) -> bool:
    if isinstance(v, TensorVariable):
        return True
    if isinstance(v, (TupleVariable, ListVariable)):
        return any(holds_tensor(x) for x in v.items)
    if isinstance(v, DictVariable):
        return any(holds_tensor(x) for x in v.items.values())
    return False


def not_captured(name: str, part: str, e: Unsupported) -> Unsupported:
    """A break at the ``apply`` call for one inside ``forward`` or ``backward``: the glue runs
    ``apply`` itself eagerly (the break's own frames would have it compile ``apply``'s code)."""
    where = f" at {e.filename}:{e.lineno}: {(e.source_line or '').strip()}" if e.located else ""
    return Unsupported(f"{name}.{part} is not captured ({e.reason}{where}); {name}.apply runs eagerly")


def mark_region(key, inputs, saved, outputs):
    """The capture adapter of ``core.autograd_function`` (tensors as Proxies)."""
    return core.autograd_function(key, inputs, saved, outputs)


def capture_backward(tx, apply_var, ctx, args: list, out):
    """``out`` (the traced forward's result) as the outputs of a region whose gradient is the
    user's backward; raises Unsupported (a break naming the function) where it cannot be."""
    name = ctx.name
    inputs = [a for a in args if is_tensor(a)]
    outs = _output_items(name, out)
    tensors_out = [o for o in outs if is_tensor(o)]
    aliased = _check_outputs(name, inputs, tensors_out)
    marked = {o.proxy.node for o in ctx.non_differentiable}
    differentiable = tuple(o.proxy.meta.dtype.is_floating_point and o.proxy.node not in marked
                           for o in tensors_out)
    if not any(differentiable):
        return out  # no output carries a gradient: the backward can never run
    if not ctx.materialize and sum(differentiable) > 1:
        raise Unsupported(f"{name}.apply: set_materialize_grads(False) with several differentiable "
                          "outputs (which gradients are None is known only when backward runs)")
    saved = _saved_values(ctx)
    slots = tuple(ctx.materialize or d for d in differentiable)
    backward = _trace_backward(tx, apply_var, ctx, args, outs, saved, slots)
    key = register(CustomFunction(name, backward, differentiable, slots, ctx.materialize))
    why = f"{name}.apply returns a view of its input in eager, a value of its own in kiln"
    result = tx.call_adapter(mark_region, [ConstantVariable(key), TupleVariable(inputs),
                                           TupleVariable(saved), TupleVariable(tensors_out)],
                             {}, f"{name}.apply")
    results = [mutation._view_var(tx, r.proxy, o, [ViewStep(None, (), {}, why)]) if alias else r
               for r, o, alias in zip(result.items, tensors_out, aliased)]
    new = iter(results)
    if is_tensor(out):
        return next(new)
    return TupleVariable([next(new) if is_tensor(o) else o for o in outs])


def _output_items(name, out) -> list:
    if is_tensor(out):
        return [out]
    if type(out) is TupleVariable:
        for o in out.items:
            if not is_tensor(o) and not isinstance(o, ConstantVariable):
                raise Unsupported(f"{name}.apply with grad enabled: forward returns {o} in its tuple "
                                  "(tensors and constants are captured)")
        return list(out.items)
    raise Unsupported(f"{name}.apply with grad enabled: forward returns {out} (a tensor or a tuple "
                      "is captured)")


def _check_outputs(name, inputs, outputs) -> list:
    """Which outputs are an input or a view of one (eager returns those as views of the input:
    the region's result is then linked to the input's memory with an uncertain step, so an
    in-place write to either makes reading the other a graph break)."""
    nodes = {a.proxy.node for a in inputs}
    storages = {id(a.alias.storage) for a in inputs if a.alias is not None}
    for o in outputs:
        if o.proxy.meta.dtype.is_complex:
            raise Unsupported(f"{name}.apply with grad enabled: a complex output is not captured")
    return [o.proxy.node in nodes or (o.alias is not None and id(o.alias.storage) in storages)
            for o in outputs]


def _saved_values(ctx) -> list:
    """The values backward may read from ctx: the saved tensors, and the Python numbers held in
    the graph that attributes hold. A tensor attribute that is not also saved is refused."""
    saved = [v for v in ctx.saved or () if is_tensor(v)]
    ids = {id(v) for v in saved}
    for attr, value in ctx.attrs.items():
        if isinstance(value, TensorVariable) and (id(value) in ids):
            continue
        if isinstance(value, TensorVariable) and getattr(value, "python_float", False):
            saved.append(value)  # a number: eager keeps the Python number itself
            ids.add(id(value))
        elif holds_tensor(value):
            raise Unsupported(f"{ctx.name}.apply with grad enabled: ctx.{attr} holds a tensor that "
                              "is not saved with ctx.save_for_backward")
    return saved


class _ReadOnlyEffects:
    """The side-effect log while backward is traced: reads go to the forward's log; a write
    to state reached from the inputs would be replayed after the forward, so it is refused."""

    def __init__(self, inner, name):
        self._inner, self._name = inner, name

    def __getattr__(self, attr):
        return getattr(self._inner, attr)

    def _refuse(self, what):
        raise Unsupported(f"{self._name}.backward {what}: Python state written by a backward is "
                          "not captured")

    def store_attr(self, var, name, value):
        self._refuse(f"sets attribute {name!r}")

    def mutate(self, container):
        if container.source is not None:
            self._refuse("changes a list or dict it did not make")
        self._inner.mutate(container)

    def store_global(self, globals_, name, value):
        self._refuse(f"sets global {name!r}")

    def store_cell(self, cell):
        self._refuse("assigns a free variable")

    def record_call(self, fn, args, kwargs):
        self._refuse(f"calls {getattr(fn, '__name__', fn)}")


def _trace_backward(tx, apply_var, ctx, args, outs, saved, slots) -> Graph:
    name = ctx.name
    graph = Graph(re.sub(r"\W", "_", name) + "_backward")
    for i, v in enumerate(saved):
        p = graph.placeholder(f"saved_{i}", v.proxy.meta.with_(requires_grad=False))
        ctx.backward_values[id(v)] = tx.wrap_result(Proxy(p))
    placeholders = {id(var) for var in ctx.backward_values.values()}
    ctx.saved_in_backward = [ctx.backward_values[id(v)] if is_tensor(v) else v for v in ctx.saved or ()]
    grads, slot = [], iter(slots)
    for i, o in enumerate(outs):
        if is_tensor(o) and next(slot):
            m = o.proxy.meta
            grads.append(tx.wrap_result(Proxy(graph.placeholder(f"grad_{i}", TensorMeta.contiguous(
                m.shape, m.dtype, m.device)))))
        else:
            grads.append(ConstantVariable(None))
    fn = apply_var.method(tx, _backward_name(apply_var.cls, name))
    state = (tx.graph, tx.grad_enabled, tx.side_effects, tx.autocast)
    sizes = (len(tx.graph.nodes), len(tx.input_sources), len(tx.storages), len(graph.placeholders))
    tx.graph, tx.grad_enabled = graph, False  # eager's engine runs backward with grad off
    tx.side_effects = _ReadOnlyEffects(state[2], name)
    tx.autocast = AutocastState.outside()  # ... and outside the forward's autocast region
    graph.call_hook = tx.autocast.cast_inputs
    ctx.in_backward = True
    try:
        with graph.inherit():
            returned = fn.call(tx, [ctx, *grads], {})
        results = _gradients(name, args, returned)
    except Unsupported as e:
        raise not_captured(name, "backward", e) from e
    finally:
        tx.graph, tx.grad_enabled, tx.side_effects, tx.autocast = state
        graph.call_hook = None
        ctx.in_backward = False
    _check_contained(tx, name, graph, sizes, placeholders)
    graph.output(tuple(results))
    return graph


def _backward_name(cls, name) -> str:
    backward, vjp = overrides(cls, "backward"), overrides(cls, "vjp")
    if backward == vjp:
        raise Unsupported(f"{name} defines {'both backward and vjp' if backward else 'no backward'} "
                          "(eager raises when backward runs)")
    return "backward" if backward else "vjp"


def _gradients(name, args, returned) -> list:
    """One gradient Proxy (or None) per tensor argument, as eager's engine checks them: the
    count (trailing Nones dropped), None for non-tensors, a tensor's shape equal to the input's
    or one the input broadcasts to (summed down), its device."""
    items = list(returned.items) if type(returned) is TupleVariable else [returned]
    none = [isinstance(g, ConstantVariable) and g.value is None for g in items]
    if len(items) > len(args) and all(none[len(args):]):
        items, none = items[:len(args)], none[:len(args)]
    if len(items) != len(args):
        raise Unsupported(f"returned {len(items)} gradients for {len(args)} inputs (eager raises)")
    grads = []
    for i, (a, g, is_none) in enumerate(zip(args, items, none)):
        if not is_tensor(a):
            if not is_none:
                raise Unsupported(f"returned a gradient for argument {i}, which is not a tensor "
                                  "(eager raises)")
            continue
        if is_none:
            grads.append(None)
            continue
        if not is_tensor(g):
            raise Unsupported(f"returned {g} for argument {i} (eager expects a tensor or None)")
        gp, meta = g.proxy, a.proxy.meta
        if gp.device != meta.device or not (same_shape(gp.shape, meta.shape)
                                            or broadcasts_to(meta.shape, gp.shape)):
            raise Unsupported(f"returned a gradient of shape {list(gp.shape)} on {gp.device} for "
                              f"argument {i} of shape {list(meta.shape)} on {meta.device} (eager raises)")
        grads.append(gp)
    return grads


def _check_contained(tx, name, graph, sizes, placeholders):
    """Nothing the backward recorded may read a value outside its graph, make a graph input,
    or write into a saved tensor (eager's saved tensors are the forward's own memory)."""
    n_nodes, n_inputs, n_storages, n_placeholders = sizes
    outside = len(tx.graph.nodes) != n_nodes or len(tx.input_sources) != n_inputs or \
        len(graph.placeholders) != n_placeholders or \
        any(i.graph is not graph for n in graph.nodes for i in n.inputs())
    if outside:
        raise Unsupported(f"{name}.backward is not captured (it uses a tensor it was not handed: "
                          f"not saved with ctx.save_for_backward); {name}.apply runs eagerly")
    new = tx.storages[n_storages:]
    del tx.storages[n_storages:]  # the backward's own memory: nothing to write back
    for st in new:
        if st.version and id(st.root) in placeholders:
            raise Unsupported(f"{name}.backward is not captured (it writes in place into a saved "
                              f"tensor); {name}.apply runs eagerly")
