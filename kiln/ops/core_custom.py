"""User-defined torch ops (``torch.library.custom_op``, ``Library.define``) as opaque nodes.

``core.custom_op(target, *args, **kwargs)`` runs the op named by ``target`` (a fallback target
name, ``"torch.ops.mylib.f.default"``, resolved by ``core_fallback.resolve``). Kiln cannot look
inside it: its meta comes from the op's fake (meta) implementation, run on torch's meta device
(``custom_meta``), and it decomposes to ``prims.custom_op``, a library prim the wrapper calls
between kernels, like a fallback node.

Symbolic sizes: the fake implementation only ever sees ints, so it is run at the traced sizes
and at a few other values of the symbols, and every output size and stride is matched to an
expression of the inputs' sizes (``a * e + b`` for an input size, stride, numel or SymInt
argument ``e``). When one fits at every probe, the output is symbolic and no guard is added;
otherwise the sizes are specialized, as a fallback node's are. Because a fit is inferred, the
prim checks each result's shape and dtype against the promised ones at run time and raises
naming the op (``CustomOpShapeError``) rather than let kernels read a wrong layout.

An op that mutates arguments (``mutates_args``, ``Tensor(a!)``) is ``core.custom_op_mutating``:
the op runs on copies of the arguments it writes and returns their new values after its own
results, and capture writes those back into the arguments (kiln's functionalization: views
and graph inputs see the write). It has no VJP: capture breaks where a gradient is needed.

Autograd (``custom_op_vjp``): the gradient is torch's own for the op. The backward graph holds
``core.custom_op_backward``. For a ``custom_op`` it calls the formula registered with
``register_autograd`` as torch's generated autograd.Function does: ``setup_context`` on the
saved inputs and outputs, then ``backward`` (the op does not run again, so an op that draws
random numbers keeps its draw). For an op whose formula is an Autograd kernel on a ``Library``
(``register_autograd`` of a ``Library.define`` op, or a CompositeImplicitAutograd op), whose
formula torch does not expose, it runs the op again on the saved inputs with grad enabled and
calls ``torch.autograd.grad`` (a random op there would draw again). Capture only emits a
differentiable node when an autograd formula is registered (capture/custom_ops.py); otherwise
it is a graph break and eager decides (torch raises for a ``custom_op`` without one).
"""
from __future__ import annotations

import torch

from kiln.graph.node import flatten_args
from kiln.meta.symbolic import SymInt, concretize, shape_env_of, to_sympy
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops.registry import DECOMPOSITIONS, LOWERINGS, META_RULES, VJP_RULES, define, stage_api
from kiln.graph.proxy import Proxy

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported


# core.* names (kiln/ops/core.py imports them); prims.custom_op is re-exported by prims.py
__all__ = ["custom_op", "custom_op_backward", "custom_op_mutating"]


class CustomOpShapeError(RuntimeError):
    pass


class CustomOpMetaError(TypeError):
    pass


def _resolve(target):
    from kiln.ops.core_fallback import resolve
    return resolve(target)


def _map(obj, fn):
    if isinstance(obj, tuple):
        return tuple(_map(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_map(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return fn(obj)


# ------------------------------------------------------------------ meta
def _run_fake(target, args, kwargs, values, drop=()):
    """Outputs of the fake implementation at symbol ``values`` (without the results ``drop``
    lists: those an op returns as its mutated arguments): [(shape, stride, dtype)], several?"""
    def fake(a):
        if isinstance(a, TensorMeta):
            return torch.empty_strided(concretize(a.shape, values), concretize(a.stride, values),
                                       dtype=a.dtype, device="meta")
        if isinstance(a, SymInt):
            return concretize(a, values)
        return a
    f_args, f_kwargs = _map((args, kwargs), fake)
    out = _resolve(target)(*f_args, **f_kwargs)
    outs = () if out is None else out if isinstance(out, (tuple, list)) else (out,)
    outs = [t for i, t in enumerate(outs) if i not in drop]
    if not all(isinstance(t, torch.Tensor) for t in outs):
        kinds = ", ".join(type(t).__name__ for t in outs)
        raise CustomOpMetaError(f"[meta] core.custom_op({target}): returns {kinds}, not only tensors")
    return [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in outs], not isinstance(out, torch.Tensor)


def _candidates(args, kwargs):
    """Size expressions the inputs offer (sizes, strides, numels, SymInt arguments)."""
    exprs = []
    for a in flatten_args((args, kwargs)):
        if isinstance(a, TensorMeta):
            exprs += [to_sympy(s) for s in a.shape] + [to_sympy(s) for s in a.stride]
            exprs.append(to_sympy(a.numel()))
        elif isinstance(a, SymInt):
            exprs.append(a.expr)
    seen, out = set(), []
    for e in exprs:
        if hasattr(e, "free_symbols") and e.free_symbols and e not in seen:
            seen.add(e)
            out.append(e)
    return out


def _fit(values: list, cands: list, points: list):
    """An expression equal to ``values[i]`` at ``points[i]`` for every probe, or None."""
    if all(v == values[0] for v in values):
        return values[0]
    for e in cands:
        ev = [concretize(e, p) for p in points]
        if ev[1] == ev[0]:
            continue
        a, rem = divmod(values[1] - values[0], ev[1] - ev[0])
        if rem or a == 0:
            continue
        b = values[0] - a * ev[0]
        if all(a * x + b == v for x, v in zip(ev, values)):
            return a * e + b
    return None


def _probes(env, symbols):
    """The traced sizes and three other assignments of the symbols that keep every guard true
    (distinct, unrelated values, so a fit that holds at all of them is not a coincidence)."""
    hints = {s: env.hints[s] for s in symbols}
    points = [hints]
    for k, (mul, add) in enumerate(((1, 5), (2, 11), (3, 29))):
        points.append({s: hints[s] * mul + add + 7 * i * (k + 1) for i, s in enumerate(symbols)})
    for g, _ in env.guards:
        for p in points[1:]:
            try:
                holds = bool(g.xreplace({s: p.get(s, env.hints.get(s, 0)) for s in g.free_symbols}))
            except TypeError:  # not decided at the probe: do not fit
                return None
            if not holds:
                return None
    return points


def _symbolic_outputs(target, args, kwargs, env, drop):
    symbols = sorted({s for a in flatten_args((args, kwargs)) for s in _symbols_of(a)}, key=str)
    points = _probes(env, symbols)
    if points is None:
        return None
    try:
        runs = [_run_fake(target, args, kwargs, p, drop) for p in points]
    except Exception:  # noqa: BLE001 - the fake impl refuses other sizes: specialize instead
        return None
    if any(len(r[0]) != len(runs[0][0]) for r in runs):
        return None
    cands = _candidates(args, kwargs)
    outs = []
    for i, (shape0, _, dtype) in enumerate(runs[0][0]):
        if any(len(r[0][i][0]) != len(shape0) or r[0][i][2] != dtype for r in runs):
            return None
        shape = [_fit([r[0][i][0][d] for r in runs], cands, points) for d in range(len(shape0))]
        if any(s is None for s in shape):
            return None
        own = [e for e in contiguous_strides(shape) if hasattr(e, "free_symbols")]
        stride = [_fit([r[0][i][1][d] for r in runs], own + cands, points) for d in range(len(shape0))]
        if any(s is None for s in stride):
            return None
        outs.append((tuple(SymInt.make(s, env) for s in shape),
                     tuple(SymInt.make(s, env) for s in stride), dtype))
    return outs, runs[0][1]


def _symbols_of(a):
    if isinstance(a, TensorMeta):
        return {s for v in tuple(a.shape) + tuple(a.stride) for s in getattr(to_sympy(v), "free_symbols", ())}
    if isinstance(a, SymInt):
        return a.expr.free_symbols
    return ()


def _outputs_meta(target, args, kwargs, drop=()):
    """The fake implementation's outputs as TensorMetas on the inputs' device (requiring grad
    when floating and an input does), and whether the op returns a sequence."""
    metas = [a for a in flatten_args((args, kwargs)) if isinstance(a, TensorMeta)]
    if not metas:
        raise CustomOpMetaError(f"[meta] core.custom_op({target}): needs a tensor argument")
    device = next((m.device for m in metas if m.device.type != "cpu"), metas[0].device)
    grad = any(m.requires_grad for m in metas)
    env = shape_env_of(metas) or next(
        (a.env for a in flatten_args((args, kwargs)) if isinstance(a, SymInt)), None)
    fitted = _symbolic_outputs(target, args, kwargs, env, drop) if env is not None else None
    if fitted is None:  # static, or no fit: specialize the sizes the inputs have
        specialized = _map((args, kwargs), lambda a: a.with_(shape=tuple(int(s) for s in a.shape),
                                                             stride=tuple(int(s) for s in a.stride))
                           if isinstance(a, TensorMeta) else int(a) if isinstance(a, SymInt) else a)
        fitted = _run_fake(target, specialized[0], specialized[1], {}, drop)
    outs, several = fitted
    return [TensorMeta(shape, stride, dtype, device, grad and dtype.is_floating_point)
            for shape, stride, dtype in outs], several


def custom_meta(target, *args, **kwargs):
    """The op's outputs: one TensorMeta, or a tuple of them for an op returning several."""
    outs, several = _outputs_meta(target, args, kwargs)
    if not outs:
        raise CustomOpMetaError(f"[meta] core.custom_op({target}): returns no tensor")
    return tuple(outs) if several else outs[0]


# ------------------------------------------------------------------ the library prim
def _spec(meta):
    """What the prim promises: (several results?, ((shape, stride, dtype), ...))."""
    metas = meta if isinstance(meta, tuple) else (meta,)
    return isinstance(meta, tuple), tuple((tuple(m.shape), tuple(m.stride), m.dtype) for m in metas)


def _prim_eager(target, spec, *args, **kwargs):
    """Call the op; check its results against the promised shape and dtype of each (strides
    are the wrapper's: ``ensure_layout`` copies a result laid out otherwise)."""
    out = _resolve(target)(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != len(spec[1]):
        raise CustomOpShapeError(f"kiln: {target} returned {len(outs)} results, its fake "
                                 f"implementation {len(spec[1])}")
    for i, (t, (shape, _, dtype)) in enumerate(zip(outs, spec[1])):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            got = type(t).__name__ if not isinstance(t, torch.Tensor) else f"{t.dtype}{list(t.shape)}"
            raise CustomOpShapeError(
                f"kiln: {target} result {i} is {got}, but its fake (meta) implementation gave "
                f"{dtype}{list(shape)} (sizes fitted over symbolic shapes are checked here; "
                f"compile with dynamic=False if the fake implementation branches on sizes)")
    return tuple(outs) if spec[0] else out


def _prim_meta(target, spec, *args, **kwargs):
    metas = [a for a in flatten_args((args, kwargs)) if isinstance(a, TensorMeta)]
    device = next((m.device for m in metas if m.device.type != "cpu"), metas[0].device)
    out = tuple(TensorMeta(shape, stride, dtype, device) for shape, stride, dtype in spec[1])
    return out if spec[0] else out[0]


def _prim_lowering(ctx, meta, *args, **kwargs):
    if isinstance(meta, tuple):
        return L.extern_multi_rule(ctx, meta, *args, **kwargs)
    return L.extern_rule(ctx, meta, *args, **kwargs)


# random=True: an opaque op may draw random numbers (or have effects): never merged by CSE,
# never recomputed by the partitioner
prim_custom_op = define("prims", "custom_op", _prim_eager, library=True, random=True)
META_RULES[prim_custom_op] = _prim_meta
LOWERINGS[prim_custom_op] = _prim_lowering


def _metas_of(obj):
    return _map(obj, lambda a: a.meta if isinstance(a, Proxy) else a)


# ------------------------------------------------------------------ the core op
def _custom_eager(target, *args, **kwargs):
    return _resolve(target)(*args, **kwargs)


custom_op = define("core", "custom_op", _custom_eager, random=True)
META_RULES[custom_op] = custom_meta


@DECOMPOSITIONS.register(custom_op)
def _decompose(target, *args, **kwargs):
    meta = custom_meta(target, *_metas_of(args), **_metas_of(kwargs))
    return prim_custom_op(target, _spec(meta), *args, **kwargs)


# ------------------------------------------------------------------ mutating ops, functionalized
def aliased_returns(schema) -> tuple:
    """Indices of the results that are the op's mutated arguments (``Tensor(a!)`` returned)."""
    return tuple(i for i, r in enumerate(schema.returns) if r.alias_info is not None)


def _mutating_eager(target, where, *args, **kwargs):
    """Run an op that writes into the arguments ``where`` names (positions, or keyword names)
    on fresh copies of them; return its other results, then the copies (their new values)."""
    args, kwargs = list(args), dict(kwargs)
    fresh = []
    for w in where:
        holder, key = (args, w) if isinstance(w, int) else (kwargs, w)
        value = holder[key] if isinstance(w, str) or w < len(holder) else None
        if value is None:  # an omitted Tensor? / Tensor[]? argument
            continue
        if isinstance(value, (list, tuple)):  # a written Tensor[]: each tensor copied
            holder[key] = [t.clone(memory_format=torch.contiguous_format) for t in value]
            fresh.extend(holder[key])
        else:
            holder[key] = value.clone(memory_format=torch.contiguous_format)
            fresh.append(holder[key])
    op = _resolve(target)
    out = op(*args, **kwargs)
    outs = () if out is None else out if isinstance(out, (tuple, list)) else (out,)
    drop = aliased_returns(op._schema)
    return tuple(t for i, t in enumerate(outs) if i not in drop) + tuple(fresh)


def _mutating_meta(target, where, *args, **kwargs):
    outs, _ = _outputs_meta(target, args, kwargs, aliased_returns(_resolve(target)._schema))
    written = []
    for w in where:
        value = kwargs.get(w) if isinstance(w, str) else args[w] if w < len(args) else None
        written += [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(outs) + tuple(TensorMeta.contiguous(m.shape, m.dtype, m.device) for m in written)


# capture breaks where a gradient through a mutating custom op is needed
custom_op_mutating = define("core", "custom_op_mutating", _mutating_eager, random=True, differentiable=False)
META_RULES[custom_op_mutating] = _mutating_meta


@DECOMPOSITIONS.register(custom_op_mutating)
def _decompose_mutating(target, where, *args, **kwargs):
    meta = _mutating_meta(target, where, *_metas_of(args), **_metas_of(kwargs))
    return prim_custom_op("core.custom_op_mutating", _spec(meta), target, where, *args, **kwargs)


# ------------------------------------------------------------------ autograd
def _differentiable(a) -> bool:
    return isinstance(a, TensorMeta) and a.requires_grad and (a.dtype.is_floating_point or a.dtype.is_complex)


def _opdef_formula(target):
    """(setup_context, backward) of a ``torch.library.custom_op`` with a registered formula."""
    from torch._library.custom_ops import OPDEFS
    op = _resolve(target)
    opdef = OPDEFS.get(op._schema.name) if isinstance(op, torch._ops.OpOverload) else None
    if opdef is None or opdef._backward_fn is None:
        return None
    return opdef._setup_context_fn, opdef._backward_fn


class _Ctx:
    """What a custom op's ``setup_context`` and ``backward`` use of ``torch.autograd.Function``'s
    ctx, for calling them outside an autograd.Function."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def set_materialize_grads(self, value):
        self.materialize_grads = value

    def mark_non_differentiable(self, *tensors):
        pass


def _direct_backward(target, args, need, outs, given, grads, kwargs):
    """The registered formula called as torch's autograd.Function would: ``setup_context`` on
    the saved inputs and outputs, then ``backward`` (no second run of the op)."""
    setup, backward = _opdef_formula(target)
    op = _resolve(target)
    schema = op._schema
    full_args, full_kwargs = torch._library.utils.fill_defaults(schema, tuple(args), dict(kwargs))
    needs = tuple(list(w) if isinstance(w, tuple) else w for w in need)  # a list per Tensor[]
    ctx = _Ctx(needs + (False,) * (len(full_args) - len(need)))
    returns = schema.returns  # the output as the op returned it: a Tensor, a tuple or a list
    if len(returns) == 1 and isinstance(returns[0].type, torch._C.ListType):
        output = list(outs)
    else:
        output = outs[0] if len(returns) == 1 else tuple(outs)
    if setup is not None:
        if any(a.kwarg_only for a in schema.arguments):
            setup(ctx=ctx, inputs=full_args, keyword_only_inputs=full_kwargs, output=output)
        else:
            setup(ctx=ctx, inputs=full_args, output=output)
    it = iter(grads)
    gs = [next(it) if w else (torch.zeros_like(o) if ctx.materialize_grads else None)
          for o, w in zip(outs, given)]
    res = backward(ctx, *gs)
    res = res if isinstance(res, tuple) or (isinstance(res, list) and len(need) > 1) else (res,)
    return list(_needed(res, need))


def _replay_backward(target, args, need, given, grads, kwargs):
    """Torch's autograd of the op, run again on the saved inputs (an op whose formula is an
    Autograd kernel registered on a ``Library``, or a CompositeImplicitAutograd op)."""
    def leaf(a, w):
        if isinstance(w, tuple):  # a Tensor[] argument
            return [x.detach().requires_grad_() if wi else x for x, wi in zip(a, w)]
        return a.detach().requires_grad_() if w else a
    with torch.enable_grad():
        inputs = [leaf(a, w) for a, w in zip(args, need)]
        out = _resolve(target)(*inputs, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    chosen = [o for o, w in zip(outs, given) if w]
    pairs = [(o, g) for o, g in zip(chosen, grads) if isinstance(o, torch.Tensor) and o.requires_grad]
    diff = list(_needed(inputs, need))
    if not pairs:
        return [None] * len(diff)
    return torch.autograd.grad([o for o, _ in pairs], diff, [g for _, g in pairs], allow_unused=True)


def _backward_eager(target, n, n_out, need, given, *rest, **kwargs):
    """The gradients of the inputs that ``need`` marks (zeros where the formula gives None).
    ``rest``: the n inputs, then the n_out outputs (direct formula) or none (replay), then
    the gradients of the outputs that ``given`` marks."""
    args, outs, grads = rest[:n], rest[n:n + n_out], rest[n + n_out:]
    if n_out:
        res = _direct_backward(target, args, need, outs, given, grads, kwargs)
    else:
        res = _replay_backward(target, args, need, given, grads, kwargs)
    diff = list(_needed(args, need))
    return tuple(_as_grad_of(r, x, target) for r, x in zip(res, diff))


def _needed(values, need):
    """The entries of values (one per argument; a list for a Tensor[] argument) that need
    marks, flat, in argument order."""
    for v, w in zip(values, need):
        if isinstance(w, tuple):
            yield from (x for x, wi in zip(v if v is not None else [None] * len(w), w) if wi)
        elif w:
            yield v


def _as_grad_of(r, x, target):
    """A formula's result as torch's autograd hands it on: zeros for None, summed down to the
    input's shape where it was broadcast, in the input's dtype."""
    if r is None:
        return torch.zeros_like(x)
    if r.shape != x.shape:
        try:
            r = r.sum_to_size(x.shape)
        except RuntimeError:
            raise RuntimeError(f"kiln: the backward of {target} returned a gradient of shape "
                               f"{list(r.shape)} for an input of shape {list(x.shape)}") from None
    return r.to(x.dtype) if r.dtype != x.dtype else r


def _backward_meta(target, n, n_out, need, given, *rest, **kwargs):
    return tuple(TensorMeta.contiguous(a.shape, a.dtype, a.device) for a in _needed(rest[:n], need))


custom_op_backward = define("core", "custom_op_backward", _backward_eager, random=True, differentiable=False)
META_RULES[custom_op_backward] = _backward_meta


@DECOMPOSITIONS.register(custom_op_backward)
def _decompose_backward(target, n, n_out, need, given, *rest, **kwargs):
    meta = _backward_meta(target, n, n_out, need, given, *_metas_of(rest))
    return prim_custom_op("core.custom_op_backward", _spec(meta), target, n, n_out, need, given,
                          *rest, **kwargs)


@VJP_RULES.register(custom_op)
def custom_op_vjp(g, out, target, *args, **kwargs):
    """A ``custom_op``'s registered formula is called directly on the saved inputs and outputs;
    any other op's autograd runs again in the backward (``_replay_backward``)."""
    return _vjp(g, out, target, args, kwargs, _opdef_formula(target) is not None)


def custom_op_vjp_replay(g, out, target, *args, **kwargs):
    """The VJP of an opaque call whose autograd is torch's, run again in the backward
    (``core.fallback``'s rule)."""
    return _vjp(g, out, target, args, kwargs, False)


def _vjp(g, out, target, args, kwargs, direct):
    gs = g if isinstance(g, tuple) else (g,)
    outs = out if isinstance(out, tuple) else (out,)
    given = tuple(x is not None for x in gs)
    def needs(a):
        if isinstance(a, (list, tuple)) and any(isinstance(x, Proxy) for x in a):
            return tuple(isinstance(x, Proxy) and _differentiable(x.meta) for x in a)
        return isinstance(a, Proxy) and _differentiable(a.meta)
    need = tuple(needs(a) for a in args)
    if not any(any(w) if isinstance(w, tuple) else w for w in need) or not any(given):
        return (None,) * (len(args) + 1)
    saved = outs if direct else ()
    grads = iter(custom_op_backward(target, len(args), len(saved), need, given, *args, *saved,
                                    *[x for x in gs if x is not None], **kwargs))
    return (None,) + tuple([next(grads) if wi else None for wi in w] if isinstance(w, tuple)
                           else next(grads) if w else None for w in need)
