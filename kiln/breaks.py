"""The api's graph-break path: re-trace up to the break, build the glue and resume functions.

``CompiledFunction._at_graph_break`` calls ``retrace_at_break`` (through ``api.AT_BREAK``, set
at the end of this module) when capture raised ``Unsupported`` (and ``fullgraph`` is off). The
capture it returns has ``break_state`` (capture/resume.py) and ``glue``; the prefix graph is
compiled like any other, and ``BreakEntry.run`` calls ``glue(outs, L)`` after it, which runs
the breaking instruction and calls the resume function.
"""
from __future__ import annotations

import types

from kiln import api, api_args, context, log
from kiln.api import CompiledFunction, CompiledModule
from kiln.capture import Unsupported, controls, trace
from kiln.capture.resume import CannotResume, build_glue, plan_break
from kiln.capture.values_callables import FunctionVariable, ModuleVariable, TorchFunctionVariable
from kiln.eager_runs import note_eager_run
from kiln.module_hooks import HookedForward
from kiln.pipeline import StageError


def retrace_at_break(cf, cache, err, args, kwargs):
    """The capture of ``cf``'s call up to the break ``err``, with its glue; None when the break
    cannot be resumed (then ``cache.eager_reason`` says why and the function runs eagerly).
    A break inside a for loop first tries to resume inside the loop; if that fails, the
    re-trace runs again stopping before the loop (its rest then runs eagerly)."""
    try:
        plan = plan_break(err, cf.code)
        try:
            capture, glue, codes = _capture_with_glue(cf, cache, plan, err, args, kwargs)
        except (CannotResume, Unsupported) as why:
            if not plan.in_loop:
                raise
            log.log("graph_breaks", "%s: cannot resume inside the loop (%s); the graph stops "
                    "before the loop and the rest of the frame runs eagerly", cf.name, why)
            plan = plan_break(err, cf.code, loops=False)
            capture, glue, codes = _capture_with_glue(cf, cache, plan, err, args, kwargs)
    except (CannotResume, Unsupported) as why:
        cache.eager_reason = f"graph break: {err}; it cannot be resumed: {why}"
        cache.eager_where = (err.filename, err.lineno)
        log.log("graph_breaks", "%s runs eagerly: %s", cf.name, cache.eager_reason)
        _record(err, [], True, cache.eager_reason)
        return None
    except Exception as e:  # noqa: BLE001 - an internal error while building the resume path
        return cf._internal_error(cache, StageError("capture", f"graph break at {err.filename}:"
                                                    f"{err.lineno}: {type(e).__name__}: {e}"), e)
    capture.glue = glue
    names = [getattr(c, "co_qualname", c.co_name) for c in codes]
    _record(err, names, plan.eager_rest, None)
    state = capture.break_state
    log.detail("graph_breaks", "%s: at %s (instruction %d); live values passed on: stack %s, locals %s",
               cf.name, getattr(state.instructions[state.index], "opname", "?"), state.index,
               [type(v).__name__ for v in state.stack], sorted(state.locals))
    what = "runs eagerly" if plan.eager_rest else "resumes compiled"
    log.log("graph_breaks", "%s: graph break at %s:%s (%s); the prefix graph has %d outputs; "
            "the rest %s in %s", cf.name, err.filename, err.lineno, err.reason,
            len(capture.break_state.outputs), what, ", ".join(c.co_name for c in codes))
    return capture


def _capture_with_glue(cf, cache, plan, err, args, kwargs):
    """Trace ``cf``'s call up to ``plan``'s stop and build the glue there."""

    api._local.compiling = True
    try:
        with context.timed("capture"):
            try:
                capture = _trace_to_break(cf, cache, plan, args, kwargs)
            except Exception as e:  # noqa: BLE001 - re-raised unless dynamic floats caused it
                if not cache.auto_dynamic_floats:
                    raise
                log.log("dynamic", "%s: with floats %s as graph inputs the capture up to the break "
                        "failed (%s); they stay constants", cf.name, sorted(cache.auto_dynamic_floats), e)
                cache.static_floats |= cache.auto_dynamic_floats
                cache.auto_dynamic_floats.clear()
                capture = _trace_to_break(cf, cache, plan, args, kwargs)
    finally:
        api._local.compiling = False
    where = (err.filename, err.lineno, err.reason)  # not err: it holds the trace's frames
    glue, codes = build_glue(capture.break_state, api._unwrap(cf.fn), _resume_maker(cf, where),
                             _callee_wrapper(cf, where) if plan.wrap_callee else None)
    return capture, glue, codes


def _trace_to_break(cf, cache, plan, args, kwargs):
    return trace(cf.fn, args, kwargs, dynamic=cf.dynamic, auto_dynamic=cache.auto_dynamic, plan=plan,
                 auto_dynamic_ints=cache.auto_dynamic_ints, auto_dynamic_floats=cache.auto_dynamic_floats,
                 module_identity=cf.mode in api_args.CUDAGRAPH_MODES)


def _record(err, resume_names, eager_rest, eager_reason):
    """The break as an event of the compile (the debug dump and the report read it)."""
    ctx = context.current()
    if ctx is not None:
        ctx.events.append({"kind": "graph_break", "lineno": err.lineno, "resume": resume_names,
                           "eager_rest": bool(eager_rest), "eager_reason": eager_reason})


def _opts(cf):
    return dict(fullgraph=cf.fullgraph, dynamic=cf.dynamic, backend=cf.backend, mode=cf.mode,
                options=cf.options, private_cache=cf._private_family if cf._private is not None else False,
                recompile_limit=cf.recompile_limit)


def _resume_maker(cf, where):
    family = cf.resume_family  # shared down the chain: a resume code gets one CompiledFunction

    def make(code, closure, eager):
        hit = family.get((code, eager))
        if hit is not None and hit[0] is closure:
            return hit[1]
        fn = types.FunctionType(code, cf.globals, code.co_name, None, closure)
        fn.__qualname__ = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
        made = _noted_rest(fn, cf, where) if eager else CompiledFunction(fn, **_opts(cf))
        if not eager:
            made.resume_family = family
            made.is_resume = True
        family[(code, eager)] = (closure, made)
        return made
    return make


def _noted_rest(fn, cf, where):
    """The uncompiled rest of a frame after a break, noted on each run (kiln/eager_runs.py)."""
    filename, lineno, reason = where
    why = (f"the rest of {cf.name} after the graph break at line {lineno} ({reason}) "
           f"cannot resume compiled; it runs uncompiled")
    code = cf.code

    def rest(*args):
        note_eager_run(why, code, lineno, filename=filename)
        return fn(*args)
    rest.__qualname__ = rest.__name__ = fn.__name__
    return rest


def _callee_wrapper(cf, where):
    """A break inside an inlined call: the callee (known at compile time, and guarded) is
    called through kiln's compile, so its own body is compiled. A plain function is handed
    over compiled; a module's method as ``(compiled function, module variable)``, which the
    glue binds to the module it loads at run time: modules are guarded by type, so the
    module of a later call may be another instance (the next of twelve blocks)."""

    def wrap(v):
        target = owner = None
        if isinstance(v, TorchFunctionVariable):
            # torch's own Python function (inlined, capture/values.py), which broke inside: it
            # runs natively at the break, as the call would have had it not been inlined; the
            # break is reported with its reason
            return None
        if isinstance(v, FunctionVariable) and v.self_var is None and (
                v.fn is None or v.by_code and v.source is not None):
            # made in the frame, or made at run time and guarded by its code (a closure
            # passed in): a new function object per call, with its own cells
            return CompileAtRun(_opts(cf))
        if isinstance(v, FunctionVariable) and v.fn is not None:
            if controls.is_disabled(v.fn) or getattr(v.fn, "_kiln_graph_break", False):
                return None
            if v.self_var is None and v.source is not None:
                target = v.fn
            elif isinstance(v.self_var, ModuleVariable):
                target, owner = v.fn, v.self_var
            elif v.self_var is not None and getattr(v.self_var, "source", None) is not None:
                # a method of another object the frame reaches (``opt.step`` of an optimizer):
                # compiled, and bound at run time to the object the glue loads, as a module's
                target, owner = v.fn, v.self_var
        elif isinstance(v, ModuleVariable) and isinstance(v.module, CompiledModule):
            return None  # compiled already (a sharded kiln.compile-d layer): called as it is
        elif isinstance(v, ModuleVariable):
            forward = v.module.forward
            if isinstance(forward, types.MethodType) and forward.__self__ is v.module and \
                    "forward" not in v.module.__dict__:
                target, owner = forward.__func__, v
        if target is None:
            # noted once, at compile time: the glue calls the callee itself, with no hook per run
            note_eager_run(f"the callee {v} of the graph break at line {where[1]} is not known "
                           f"at compile time: it runs uncompiled", cf.code, where[1],
                           filename=where[0])
            return None
        compiled = CompiledFunction(target, **_opts(cf))
        if isinstance(v, ModuleVariable):  # m(...): its hooks run around the compiled forward
            return HookedForward(compiled), owner
        return compiled if owner is None else (compiled, owner)
    return wrap


class CompileAtRun:
    """The callee of a break that is a function made in the frame (``def inner(): ...``
    called where it breaks): the glue passes it the function it made again for this call and
    calls what this returns. Functions of one code share their cache entries (by code), so a
    new function object per call compiles once."""
    compiles_at_run = True

    def __init__(self, opts):
        self.opts = opts

    def __call__(self, fn):
        return CompiledFunction(fn, **self.opts)


api.AT_BREAK = retrace_at_break  # the api's capture stage calls it at a break (api.AT_BREAK)
