"""compile(), CompiledFunction / CompiledModule, the per-code cache, recompiles and fallback."""
from __future__ import annotations

import functools
import re
import threading
import types
from typing import Any, Callable

import torch

from kiln import api_args, compiler_controls, context, counters, eager_runs, log, module_hooks
from kiln.eager_runs import note_eager_run
from kiln.module_wrapper import ModuleWrapper
from kiln.capture import Unsupported, frame_locals, trace
from kiln.capture.controls import is_disabled, stance as _stance
from kiln.capture.binding import fast_locals_builder as _fast_locals_builder
from kiln.capture.errors import eager_rejects
from kiln.capture.rebuild import fresh_aliases, new_tensor_outputs
from kiln.capture.resume_loops import TailCall, run_tail_calls, starts_in_loop
from kiln.code_caches import CodeCaches
from kiln.config import config
from kiln.pipeline import CompiledGraph, RECORDERS, StageError, compile_frame, compile_graph, emit
from kiln.runtime import profiler_regions
from kiln.ops.autocast import run_disabled
from kiln.capture.guards import argument_guards, explain_failure
from kiln.graph import Graph
from kiln.meta.symbolic import hints

_profiling = profiler_regions.enabled  # one C call per compiled call (kiln/runtime/profiler_regions.py)

class _Local(threading.local):
    """Per-thread call-path flags, with class defaults: reading a missing attribute through
    ``getattr(..., default)`` raised and caught an AttributeError on every call."""
    disabled = 0
    compiling = False
    eager_call = None  # (reason, filename, lineno): _compile's "run eagerly this call only"


_local = _Local()
_COUNTS = counters.counters  # the call path bumps its counter without a function call


# ---------------------------------------------------------------------- hooks of higher layers
# kiln/breaks.py and kiln/distributed.py sit above the api and fill these when they load
# (kiln/__init__.py imports both), so the api imports neither (docs/architecture.md, "Layers").
# The glue at a graph break: breaks.retrace_at_break(cf, cache, err, args, kwargs) -> a capture
# up to the break, an EagerEntry after an internal error there, or None (the call runs eagerly).
AT_BREAK: Callable | None = None
# kiln.compile(module) for modules that a wrapper of its own compiles, tried in order:
# (matches(module) -> bool, make(module, **opts) -> the compiled module); kiln.distributed's
# is (is_ddp, CompiledDDP): DDP's Python forward around the inner compiled one.
MODEL_WRAPPERS: list[tuple[Callable, Callable]] = []


def register_model_wrapper(matches: Callable, make: Callable) -> Callable:
    MODEL_WRAPPERS.append((matches, make))
    return make


class GraphBreakError(RuntimeError):
    """Raised under fullgraph=True where a graph break would have happened."""


def _aliased_new_outputs(spec, compiled) -> dict:
    """{position: requires_grad} of outputs the frame computed (eager: new objects) that the
    compiled graph returns as its own inputs (pipeline._input_outputs)."""
    at = getattr(compiled, "input_outputs", None)
    if not at or spec is None:
        return {}
    return {i: rg for i, rg in new_tensor_outputs(spec).items() if i in at}


class CacheEntry:
    __slots__ = ("guard_fn", "guards", "fetch", "compiled", "call", "rebuild", "grad_enabled", "capture",
                 "compile_id")

    def __init__(self, capture, compiled, grad_enabled, compile_id):
        self.capture = capture
        self.guard_fn = capture.guard_fn
        self.guards = capture.guards
        self.fetch = capture.fetch
        self.rebuild = capture.rebuild
        devices = getattr(capture, "autocast_devices", ())
        if devices and compiled is not None:  # called inside torch.autocast: the graph holds its casts, torch must not add more
            compiled = run_disabled(compiled, devices)
        self.compiled = compiled
        # the call path calls the generated wrapper itself (no CompiledGraph.__call__ frame)
        self.call = compiled.call if type(compiled) is CompiledGraph else compiled
        if type(compiled) is CompiledGraph and getattr(compiled, "holders", None) is not None:
            compiled.holders.append(self)  # a cached graph's first call puts the plain call here
        spec = getattr(self.rebuild, "spec", None)
        aliased = _aliased_new_outputs(spec, compiled)
        if aliased:  # views/detaches of inputs that the graph returns as the inputs themselves
            self.rebuild = fresh_aliases(self.rebuild, aliased)
        # the common `return t`, from the plain rebuild only (a wrapped one does more after it)
        elif type(spec) is tuple and len(spec) in (2, 3) and spec[0] in ("tensor", "new") and \
                getattr(self.rebuild, "__name__", "") == "rebuild":
            self.rebuild = lambda outputs, L, i=spec[1]: outputs[i]
        self.grad_enabled = grad_enabled
        self.compile_id = compile_id

    def run(self, L):
        # L: Python-state writes seen during capture are replayed (capture/side_effects.py)
        return self.rebuild(self.call(*self.fetch(L)), L)


class BreakEntry(CacheEntry):
    """A capture that stopped at a graph break: the prefix graph (None when it computes
    nothing the rest needs), then the glue (kiln/breaks.py, capture/resume.py)."""
    __slots__ = ("glue", "replay")

    def __init__(self, capture, compiled, grad_enabled, compile_id):
        super().__init__(capture, compiled, grad_enabled, compile_id)
        self.glue = capture.glue
        effects = getattr(self.rebuild, "spec", ("const",))[0] == "effects"
        self.replay = self.rebuild if effects else None  # Python-state writes before the break

    def run(self, L):
        outs = self.compiled(*self.fetch(L)) if self.compiled is not None else ()
        if self.replay is not None:
            self.replay(outs, L)
        return self.glue(outs, L)


class EagerEntry(CacheEntry):
    """Where a compile failed inside kiln (issue 24): calls that pass the failed entry's guards
    run eagerly; calls that do not (another shape, dtype, ...) compile again. After an error in
    capture itself there are no capture guards: the call's arguments are guarded instead."""
    __slots__ = ("call_eager", "reason", "code")

    def __init__(self, capture, grad_enabled, compile_id, call_eager, reason, code):
        self.capture = capture
        self.guard_fn, self.guards = capture.guard_fn, capture.guards
        self.fetch = self.rebuild = self.compiled = self.call = None
        self.grad_enabled = grad_enabled
        self.compile_id = compile_id
        self.call_eager = call_eager
        self.reason, self.code = reason, code

    def run(self, L):
        note_eager_run(self.reason, self.code)  # no eager run is silent
        return self.call_eager(L)


class CodeCache:
    """Everything kiln knows about one code object: its entries, or why it runs eagerly."""
    __slots__ = ("entries", "eager_reason", "compiles", "auto_dynamic", "auto_dynamic_ints", "static_ints",
                 "eager_where", "eager_quiet", "lock", "auto_dynamic_floats", "static_floats",
                 "first_sizes")

    def __init__(self):
        self.entries: list[CacheEntry] = []
        self.eager_reason: str | None = None
        self.eager_where: tuple = (None, None)  # (filename, lineno) that made it eager (a break's)
        self.eager_quiet = False  # plain Python with no tensor work: eager is the same program
        # one compile at a time per code: threads racing a miss wait for the first one's entry
        # (re-entrant: a compile may run the function natively, and it may call itself)
        self.lock = threading.RLock()
        self.compiles = 0
        # automatic dynamic (dynamic=None): input source -> dims whose size changed between calls
        self.auto_dynamic: dict[str, set] = {}
        # automatic dynamic ints: sources of Python ints whose value changed between calls
        self.auto_dynamic_ints: set[str] = set()
        self.static_ints: set[str] = set()  # ints whose symbol an op refused: constants from now on
        # automatic dynamic floats: sources of Python floats whose value changed (dynamic_floats.py)
        self.auto_dynamic_floats: set[str] = set()
        self.static_floats: set[str] = set()  # floats the trace needed as numbers: constants
        self.first_sizes: dict | None = None  # stance eager_then_compile: the eager call's sizes


# (code object, the compile options) -> its entries: a function
# compiled with another backend, fullgraph, dynamic or mode never reuses these
_CODE_CACHES = CodeCaches()  # the code object or function is held weakly (code_caches.py)
_CACHE_GEN = [0]  # moves on when _CODE_CACHES is cleared


def caches_of(code) -> list:
    """Every CodeCache of ``code`` (one per set of compile options)."""
    return [c for (k, _), c in _CODE_CACHES.items() if getattr(k, "__code__", k) is code]
# Compile contexts of recent compiles, newest last (explain and the debug dump read them).
_RECORDERS = context.RECORDERS


def _unwrap(fn):
    if isinstance(fn, types.MethodType):
        return fn.__func__
    return fn


def _uncompiled(fn):
    """A function kiln compiled already (a module whose class compiled its forward, compiled
    again whole) is compiled as the function it wraps: one frame, not a frame calling another
    that capture would trace through anyway (capture/controls.compiled_original)."""
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, CompiledFunction):
        return types.MethodType(fn.__func__.fn, fn.__self__)
    return fn.fn if isinstance(fn, CompiledFunction) else fn


def _as_python_function(fn):
    """A callable with no bytecode of its own (a builtin such as ``torch.sin`` or
    ``F.linear``) as a Python function that calls it, so capture has a frame to trace."""
    func = _unwrap(fn)
    if hasattr(func, "__code__"):
        return fn

    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    call.__qualname__ = call.__name__ = getattr(fn, "__name__", type(fn).__name__)
    return call


class CompiledFunction:
    _kiln_compiled_function = True  # traced as its .fn inside another compile (capture/controls.py)

    def __init__(self, fn, *, fullgraph=False, dynamic=None, backend="kiln", mode=None,
                 options=None, private_cache=False, recompile_limit=None, name=None):
        fn = _as_python_function(_uncompiled(fn))
        self.fn = fn
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.backend = backend
        self.mode = mode
        self.options = dict(options or {})
        func = _unwrap(fn)
        self.code = func.__code__
        opts = (backend, fullgraph, dynamic, mode, tuple(sorted((k, repr(v)) for k, v in self.options.items())))
        # by code, closures too: a closure's cells are read from L on each call (guarded as
        # inputs), and its resume functions take the cells as arguments (resume_cells.py)
        self._cache_key = (self.code, opts)
        self.globals = func.__globals__
        self.name = getattr(func, "__qualname__", self.code.co_name)
        self._fast_locals = _fast_locals_builder(fn)
        # isolate_recompiles and kiln.explain: entries of its own, yet shared by code with the
        # callees its breaks compile (one family per top-level compile, as the shared caches
        # are shared): an explained model's twelve blocks broke into twelve compiles of one
        # callee. True starts a family, a family's dict joins it (breaks.py).
        if private_cache:
            self._private_family = private_cache if isinstance(private_cache, dict) else {}
            self._private = self._private_family.setdefault(self._cache_key, CodeCache())
        else:
            self._private_family = self._private = None
        self.recompile_limit = recompile_limit  # None: config.recompile_limit
        if name is not None:  # torch.compile(name=...): the name logs, dumps and warnings use
            self.name = name
        self._cache_obj, self._cache_gen = None, -1  # the shared CodeCache, remembered (cache)
        # captured graph -> callable; kiln.distributed swaps in one that splits at DDP buckets
        self.compile_graph = compile_graph
        # resume functions made for this function's breaks, shared down the chain (breaks.py),
        # so a loop that breaks every iteration calls one resume function, not one per iteration
        self.resume_family: dict = {}
        self.is_resume = False  # the rest of a function after a graph break (breaks.py)
        functools.update_wrapper(self, func)
        if is_disabled(fn):  # torch.compiler.disable'd (or kiln.disable'd): never traced, as
            self.call_raw = lambda args, kwargs: fn(*args, **kwargs)  # under torch.compile

    @property
    def cache(self) -> CodeCache:
        if self._private is not None:
            return self._private
        c = self._cache_obj
        if c is not None and self._cache_gen == _CACHE_GEN[0]:
            return c  # no hash of the key tuple per call; kiln.reset() moves the generation on
        c = _CODE_CACHES.get(self._cache_key)
        if c is None:  # setdefault: threads racing the first call get one CodeCache
            c = _CODE_CACHES.setdefault(self._cache_key, CodeCache())
        self._cache_obj, self._cache_gen = c, _CACHE_GEN[0]
        return c

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __call__(self, *args, **kwargs):
        out = self.call_raw(args, kwargs)
        if type(out) is TailCall:  # a graph break's glue handed back its resume function
            out = run_tail_calls(out)
        return out

    def call_raw(self, args, kwargs):
        """A call whose result may be a ``TailCall`` (capture/resume_loops.py) still to run."""
        if config.disable or _local.disabled or _local.compiling:
            return self.fn(*args, **kwargs)
        stance = _stance()  # torch.compiler.set_stance's (kiln/compiler_controls.py)
        if stance == "force_eager":
            return self.fn(*args, **kwargs)
        cache = self.cache
        if cache.eager_reason is not None:
            return self._run_eagerly(cache, args, kwargs)
        L = self._fast_locals(args, kwargs) if self._fast_locals is not None else None
        if L is None:
            try:
                L = frame_locals(self.fn, args, kwargs)
            except TypeError:
                out = self.fn(*args, **kwargs)  # let Python raise the user's own binding error
                note_eager_run("capture could not bind the call's arguments", self.code)
                return out
        grad = torch.is_grad_enabled()
        G = self.globals
        for entry in cache.entries:
            if entry.grad_enabled == grad and entry.guard_fn(L, G):
                _COUNTS["cache_hits"] += 1
                if _profiling():  # a torch.profiler is on: the call is a named region in its trace
                    return profiler_regions.run(self.name, entry, L)
                return entry.run(L)
        if stance != "default":
            out = compiler_controls.miss_under_stance(self, stance, cache, L, args, kwargs, grad)
            if out is not compiler_controls.COMPILE:
                return out
        entry = self._compile_once(cache, L, args, kwargs, grad)
        if entry is None:
            return self._run_eagerly(cache, args, kwargs)
        if _profiling():
            return profiler_regions.run(self.name, entry, L)
        return entry.run(L)

    def _compile_once(self, cache, L, args, kwargs, grad):
        """``_compile`` under the code's lock: a thread that waited for another's compile
        looks again first, and runs that entry (or eagerly, if it made the code eager)."""
        with cache.lock:
            for entry in cache.entries:
                if entry.grad_enabled == grad and entry.guard_fn(L, self.globals):
                    _COUNTS["cache_hits"] += 1
                    return entry
            if cache.eager_reason is not None:
                return None
            return self._compile(cache, L, args, kwargs, grad)

    def _run_eagerly(self, cache, args, kwargs):
        """The frame runs natively: for good (``cache.eager_reason``) or for this call only
        (``_local.eager_call``: an op refused its arguments at capture), noted either way
        (kiln/eager_runs.py) unless it is plain Python with no tensor work."""
        why = cache.eager_reason
        if why is None:
            why, _local.eager_call = _local.eager_call, None
            out = self.fn(*args, **kwargs)  # the user's own error, if eager torch rejects it too
            if why is not None:
                note_eager_run(why[0], self.code, why[2], filename=why[1])
            return out
        if not cache.eager_quiet:
            note_eager_run(why, self.code, cache.eager_where[1], filename=cache.eager_where[0])
        return self.fn(*args, **kwargs)

    # ------------------------------------------------------------------ compiling
    def _why_miss(self, cache, L, grad) -> str:
        G = self.globals
        for entry in reversed(cache.entries):  # the newest entry is the closest to this call
            if entry.grad_enabled != grad:
                return f"torch.is_grad_enabled() changed: was {entry.grad_enabled}, now {grad}"
            guard_set = getattr(entry.capture, "guard_set", None)
            if guard_set is not None:  # plain words for the first failing check (guards.py)
                why = explain_failure(guard_set, L, G)
                if why is not None:
                    return why
            for g in entry.guards:
                try:
                    ok = eval(g, {"torch": torch, "math": __import__("math")}, {"L": L, "G": G})
                except Exception as e:  # noqa: BLE001 - a guard that cannot run has failed
                    ok = False
                    g = f"{g} (raised {type(e).__name__})"
                if not ok:
                    return f"guard failed: {g}"
        return "no guard matched"

    def _trace(self, cache, args, kwargs):
        """Capture, with the automatic dynamic ints symbolic and floats graph inputs. When the
        trace fails with floats as inputs, it runs again with them constant: if it then stops at
        the same graph break they did not cause it and stay inputs; otherwise (one was needed as
        a Python number) they stay constants for this code from now on. When a symbolic int
        made an op refuse the trace (an argument that must be a Python int), those ints stay
        constants from now on and the trace runs again."""
        ints, floats = cache.auto_dynamic_ints, cache.auto_dynamic_floats
        try:
            return trace(self.fn, args, kwargs, dynamic=self.dynamic, auto_dynamic=cache.auto_dynamic,
                         auto_dynamic_ints=ints, auto_dynamic_floats=floats,
                         module_identity=self.mode in api_args.CUDAGRAPH_MODES,
                         input_items=self.fullgraph)
        except Exception as e:  # noqa: BLE001 - re-raised unless a dynamic value caused it
            if floats:
                kept = set(floats)
                floats.clear()
                try:
                    return self._trace(cache, args, kwargs)
                except Unsupported as static:
                    if isinstance(e, Unsupported) and (static.reason, static.lineno) == (e.reason, e.lineno):
                        # the same graph break with the floats constant: they did not cause it,
                        # and stay graph inputs for the re-trace up to the break (breaks.py)
                        floats |= kept
                        raise e from None
                    raise
                finally:
                    if not floats:
                        log.log("dynamic", "%s: with floats %s as graph inputs the capture failed (%s); "
                                "they stay constants", self.name, sorted(kept), e)
                        cache.static_floats |= kept
            elif ints and "SymInt" in f"{e} {e.__cause__}":
                log.log("dynamic", "%s: symbolic ints %s made the capture fail (%s); they stay static",
                        self.name, sorted(ints), e)
                cache.static_ints |= ints
                ints.clear()
            else:
                raise
            return self._trace(cache, args, kwargs)

    def _compile(self, cache, L, args, kwargs, grad):
        """A miss: the recompile limit, then the driver (``pipeline.compile_frame``)."""
        reason = None
        if cache.entries:
            reason = self._why_miss(cache, L, grad)
            limit = config.recompile_limit if self.recompile_limit is None else self.recompile_limit
            if starts_in_loop(self.code):  # one entry per iteration that looks different
                limit = max(limit, config.loop_resume_limit)
            if len(cache.entries) >= limit:
                if self.fullgraph:  # as torch.compile: no eager fallback under fullgraph=True
                    raise GraphBreakError(f"recompile limit ({limit}) reached for {self.name} under "
                                          f"fullgraph=True (last miss: {reason})")
                cache.eager_reason = (f"recompile limit ({limit}) reached for "
                                      f"{self.name}; it runs eagerly from now on "
                                      f"(last miss: {reason})")
                log.log("recompiles", "%s", cache.eager_reason)
                counters.bump("fallbacks")
                return None  # the caller runs it eagerly, noted (_run_eagerly)
            log.log("recompiles", "recompiling %s (%s:%d): %s", self.name, self.code.co_filename,
                    self.code.co_firstlineno, reason)
            emit("recompiling", None, entries=cache.entries, L=L, G=self.globals)
            counters.bump("recompiles")
        return compile_frame(self, cache, L, args, kwargs, grad, reason)

    def _capture(self, cache, ctx, L, args, kwargs, grad, reason):
        """The driver's capture stage for this call: ``(capture, None)``, or ``(None, result)``
        where the compile stops here (``result``: an entry that runs eagerly, or None: the call
        runs eagerly)."""
        try:
            capture = self._trace_marked(cache, L, args, kwargs)
        except Unsupported as e:
            capture = self._at_graph_break(cache, ctx, e, args, kwargs)
            if capture is None or isinstance(capture, CacheEntry):
                return None, capture
        except Exception as e:  # noqa: BLE001 - an internal error in capture
            return None, self._internal_error(cache, StageError("capture", f"{type(e).__name__}: {e}"), e,
                                              L, None, grad)
        if reason is not None and self._plain_python_tail(cache, capture):
            cache.eager_reason = (f"{self.name} holds no tensor work and a value it was traced "
                                  f"with changed ({reason}); it runs as plain Python from now on")
            cache.eager_quiet = True
            log.log("recompiles", "%s", cache.eager_reason)
            return None, None
        ctx.record("capture", "bytecode", capture.bytecode)
        ctx.record("capture", "guards", capture.guard_source)
        return capture, None

    def _trace_marked(self, cache, L, args, kwargs):
        """``_trace`` with this thread marked as compiling (calls of compiled functions made
        while tracing run natively), after automatic dynamic marked what changed."""
        _local.compiling = True
        try:
            if self.dynamic is None and cache.entries:
                _note_changed_sizes(cache, L, self.globals)
            if self.dynamic is not False and cache.entries:
                _note_changed_ints(cache, L, self.globals)
                _note_changed_floats(cache, L, self.globals)
            if self.backend == "kiln":
                from kiln.runtime.builder import prestart_if_gpu
                prestart_if_gpu()  # build workers warm up while capture and lowering run
            with context.timed("capture"):
                return self._trace(cache, args, kwargs)
        finally:
            _local.compiling = False

    def _at_graph_break(self, cache, ctx, e: Unsupported, args, kwargs):
        """Capture stopped at ``e``: the capture up to the break with its glue (breaks.py); None
        where the call runs eagerly, or an ``EagerEntry`` after an internal error there."""
        ctx.graph_breaks.append(e)
        counters.bump("graph_breaks")
        if self.fullgraph and eager_rejects(e):  # eager's own exception, from the user's line
            log.log("graph_breaks", "%s; running %s eagerly this call", e, self.name)
            self.fn(*args, **kwargs)  # raises the user's error if eager rejects it too
            raise GraphBreakError(f"graph break under fullgraph=True: {e}") from None
        if e.__cause__ is not None and not isinstance(e.__cause__, Unsupported):
            # An op refused its arguments at capture (bad shapes, dim, dtype): most
            # likely the user's error. Run eagerly so torch raises its own exception
            # from the user's line; the cache stays unpoisoned for good inputs.
            log.log("graph_breaks", "%s; running %s eagerly this call", e, self.name)
            _local.eager_call = (f"capture refused an op's arguments, eager torch ran it "
                                 f"(this call only): {e.reason}", e.filename, e.lineno)
            return None
        emit("compiled", ctx, compiled=None)  # the dump of a compile that stopped at the break
        if self.fullgraph:
            raise GraphBreakError(f"graph break under fullgraph=True: {e}") from None
        log.log("graph_breaks", "%s", e)
        if AT_BREAK is None:
            raise RuntimeError(f"kiln: graph break in {self.name} at capture ({e}), but "
                               "kiln.breaks is not loaded to resume it (import kiln loads it)")
        return AT_BREAK(self, cache, e, args, kwargs)

    def _add_entry(self, cache, capture, compiled, grad, compile_id) -> CacheEntry:
        entry = (CacheEntry if capture.break_state is None else BreakEntry)(capture, compiled, grad, compile_id)
        cache.entries.append(entry)
        cache.compiles += 1
        counters.bump("frames_compiled")
        if compiled is not None:
            counters.bump("graphs_compiled")
        return entry

    def _plain_python_tail(self, cache, capture) -> bool:
        """A resume function (outside loops) whose captures hold no tensor op and no break: the
        rest of a function after ``.item()``, say (``return loss.item() * 2``). Its guards are
        on the Python values it was handed (a loss changes every step), so recompiling gains
        nothing; running it as plain Python is the same program."""
        if not self.is_resume or starts_in_loop(self.code) or capture.break_state is not None:
            return False
        return capture.graph.ops_count() == 0 and all(
            type(e) is CacheEntry and e.capture.graph.ops_count() == 0 for e in cache.entries)

    def _internal_error(self, cache, err: StageError, cause, L=None, capture=None, grad=None):
        """Fall back to eager after an error inside kiln. With the call's locals ``L``, only for
        calls like this one: an ``EagerEntry`` guarded like the entry that failed (``capture``'s
        guards, else the arguments'), so another shape or dtype still compiles; without them
        (a break's glue), the whole code runs eagerly from now on."""
        counters.bump("fallbacks")
        if self.fullgraph or config.strict:
            raise err
        reason = f"internal error: {err}"
        if L is None:
            cache.eager_reason = reason
            return None
        if capture is None:  # the error was in capture: the arguments' guards
            guard_set = argument_guards(L)
            source, fn = guard_set.compile()
            capture = types.SimpleNamespace(guard_set=guard_set, guards=guard_set.exprs(), guard_fn=fn,
                                            guard_source=source, input_sources=[], graph=Graph("eager"),
                                            break_state=None)
        ctx = context.current()
        entry = EagerEntry(capture, grad, getattr(ctx, "compile_id", None), _eager_call(self.fn),
                           reason, self.code)
        cache.entries.append(entry)
        return entry


def _eager_call(fn):
    """``call(L)``: ``fn`` called natively with the arguments a call's locals ``L`` hold."""
    func = _unwrap(fn)
    code = func.__code__
    names, npos, nkw = code.co_varnames, code.co_argcount, code.co_kwonlyargcount
    positional, kwonly = names[:npos], names[npos:npos + nkw]
    i = npos + nkw
    star = names[i] if code.co_flags & 0x04 else None
    starstar = names[i + (star is not None)] if code.co_flags & 0x08 else None

    def call(L):
        args = [L[n] for n in positional]
        if star is not None:
            args.extend(L[star])
        kwargs = {n: L[n] for n in kwonly}
        if starstar is not None:
            kwargs.update(L[starstar])
        return func(*args, **kwargs)
    return call


class CompiledModule(ModuleWrapper, torch.nn.Module):
    """A module whose forward is compiled; it shares every parameter and buffer with the
    original (which it holds as ``_orig_mod``). Attribute writes, ``training``, copies and
    pickling behave as torch's OptimizedModule's (kiln/module_wrapper.py)."""

    def __init__(self, mod: torch.nn.Module, **opts):
        super().__init__()
        self._orig_mod = mod
        self._kiln_opts = opts  # what a copy or an unpickled wrapper is compiled with again
        self._compiled_forward = CompiledFunction(mod.forward, **opts)
        # m(x) calls whatever m.forward is at call time: an instance attribute, or the method
        # of m's class now; either may change after compiling (the compiled one is for these)
        self._forward_class = type(mod)
        self._other_forwards: dict = {mod.__dict__.get("forward", type(mod)): self._compiled_forward}

    def _current_forward(self, mod):
        if type(mod) is self._forward_class and "forward" not in mod.__dict__:
            return self._compiled_forward
        key = mod.__dict__.get("forward", type(mod))  # an instance's forward, else the class
        compiled = self._other_forwards.get(key)
        if compiled is None:
            compiled = self._other_forwards[key] = CompiledFunction(mod.forward, **self._kiln_opts)
        return compiled

    def __call__(self, *args, **kwargs):
        # the original module's hooks (and the global ones) run around the compiled forward, as
        # m(...) runs them around m.forward (kiln/module_hooks.py); read on every call, so a
        # hook added after compiling counts. Hooks on this wrapper itself: nn.Module's own call
        # runs them (and the global ones) around forward.
        if self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or \
                self._backward_pre_hooks:
            return torch.nn.Module.__call__(self, *args, **kwargs)
        mod = self._modules["_orig_mod"]
        # a subclass (kiln.distributed.CompiledDDP) has a forward of its own around the compiled one
        forward = self._current_forward(mod) if type(self) is CompiledModule else self.forward
        if module_hooks.has_hooks(mod, True):
            return module_hooks.call_with_hooks(mod, forward, args, kwargs)
        return forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        mod = self._modules["_orig_mod"]
        if module_hooks.has_hooks(mod, False):  # called by nn.Module.__call__ (hooks of its own)
            return module_hooks.call_with_hooks(mod, self._current_forward(mod), args, kwargs, False)
        return self._current_forward(mod)(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


MODES = api_args.MODES


def compile(model: Callable[..., Any] | torch.nn.Module | None = None, *, fullgraph: bool = False,
            dynamic: bool | None = None, backend: str = "kiln", mode: str | None = None,
            options: dict[str, Any] | None = None, name: str | None = None, disable: bool = False,
            recompile_limit: int | None = None, isolate_recompiles: bool = False,
            shapes_spec: None = None) -> Any:
    """Compile a function or nn.Module; usable as ``@kiln.compile`` or ``@kiln.compile(...)``.
    torch.compile's signature: ``disable=True`` returns ``model`` itself; ``name`` names it in
    logs and warnings; ``recompile_limit`` overrides ``config.recompile_limit`` for it;
    ``isolate_recompiles=True`` gives it entries of its own (not shared with other compiles of
    the same code); ``shapes_spec`` is not supported (None only)."""
    options = api_args.check(fullgraph, dynamic, backend, mode, options, disable)
    api_args.check_more(name, recompile_limit, isolate_recompiles, shapes_spec)
    opts = dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                name=name, recompile_limit=recompile_limit, private_cache=isolate_recompiles)
    if model is None:
        return lambda f: compile(f, disable=disable, fullgraph=fullgraph, dynamic=dynamic,
                                 backend=backend, mode=mode, options=options, name=name,
                                 recompile_limit=recompile_limit,
                                 isolate_recompiles=isolate_recompiles)
    if disable:
        return model
    if isinstance(model, type):
        return _compile_class(model, opts)
    if isinstance(model, torch.nn.Module):
        for matches, make in MODEL_WRAPPERS:  # kiln.distributed's CompiledDDP, for DDP
            if matches(model):
                return make(model, **opts)
        return CompiledModule(model, **opts)
    if not callable(model):
        raise TypeError(f"kiln.compile expects a function or nn.Module, got {type(model).__name__}")
    return CompiledFunction(model, **opts)


def _compile_class(cls: type, opts: dict) -> type:
    """``@kiln.compile`` on a class, as torch.compile takes one: the class itself comes back
    with its instances' calls compiled, not its constructor (which compiled nothing and ran
    eagerly). An nn.Module subclass's ``forward`` is compiled (its hooks run around it, as
    around a compiled module's), any other class's ``__call__``."""
    name = "forward" if issubclass(cls, torch.nn.Module) else "__call__"
    method = getattr(cls, name, None)
    if not isinstance(method, types.FunctionType):
        raise TypeError(f"kiln.compile({cls.__name__}): a class is compiled through its {name}, "
                        f"which it does not define in Python")
    setattr(cls, name, CompiledFunction(method, **opts))
    return cls


def reset() -> None:
    """Forget every compiled entry and loaded kernel (the disk cache stays), zero the counters.
    ``torch.compiler.reset()`` calls it too (kiln/compiler_controls.py)."""
    from kiln.runtime import cache, cpp_build, triton_binary, triton_load

    _CODE_CACHES.clear()
    _CACHE_GEN[0] += 1
    eager_runs.reset()
    cache.reset_trust()  # the cache's owner and modes are checked again
    cpp_build.clear_memory()
    triton_load.clear_memory()
    triton_binary.clear_memory()
    counters.reset()


compiler_controls.install_reset_hook(reset)  # torch.compiler.reset() resets kiln too


def disable(fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Run fn without kiln: calls inside it are not compiled, and tracing stops at it."""
    if fn is None:
        return disable

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _local.disabled = getattr(_local, "disabled", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _local.disabled -= 1

    wrapper._kiln_disabled = True
    return wrapper


def graph_break() -> None:
    """A no-op in eager code; in compiled code, the graph breaks here."""


graph_break._kiln_graph_break = True


def is_compiling() -> bool:
    return bool(getattr(_local, "compiling", False))


def mark_dynamic(tensor: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Mark a size (or sizes: ``dim`` may be a list) as dynamic: the next compile that reads
    this tensor makes it a symbol (unless the size is 0 or 1), under every ``dynamic`` setting,
    as ``torch._dynamo.mark_dynamic`` does; kiln reads that mark (and ``mark_static``'s) too
    (capture/controls.py)."""
    dims = set(getattr(tensor, "_kiln_dynamic_dims", set()))
    dims.update(dim if isinstance(dim, (list, tuple, set)) else [dim])
    tensor._kiln_dynamic_dims = dims


_FLOAT_GUARD = re.compile(r"type\(\{\}\) is float and \{\} == (.+)")


def _note_changed_floats(cache: CodeCache, L, G):
    """Automatic dynamic for Python floats: a float whose value differs from the one an earlier
    compile specialized on is a graph input next time (capture/dynamic_floats.py)."""
    for entry in cache.entries:
        guard_set = getattr(entry.capture, "guard_set", None)
        for source, check in (guard_set.entries if guard_set is not None else ()):
            m = _FLOAT_GUARD.fullmatch(check)
            expr = source.expr()
            if m is None or expr in cache.auto_dynamic_floats or expr in cache.static_floats:
                continue
            try:
                now = eval(expr, {"torch": torch}, {"L": L, "G": G})  # noqa: S307
                was = float(m.group(1))
            except Exception:  # noqa: BLE001 - gone: nothing to compare
                continue
            if type(now) is float and now != was:
                cache.auto_dynamic_floats.add(expr)
                log.log("dynamic", "automatic dynamic: float %s changed (%r -> %r)", expr, was, now)


_INT_GUARD = re.compile(r"type\(\{\}\) is int and \{\} == (-?\d+)")


def _note_changed_ints(cache: CodeCache, L, G):
    """Automatic dynamic for Python ints (an argument, a module's counter attribute): a
    non-negative int whose value differs from the one an earlier compile specialized on is
    traced as a symbol next time (``Tracer._wrap_dynamic_int``)."""
    for entry in cache.entries:
        guard_set = getattr(entry.capture, "guard_set", None)
        for source, check in (guard_set.entries if guard_set is not None else ()):
            m = _INT_GUARD.fullmatch(check)
            expr = source.expr()
            if m is None or expr in cache.auto_dynamic_ints or expr in cache.static_ints:
                continue
            try:
                now = eval(expr, {"torch": torch}, {"L": L, "G": G})  # noqa: S307
            except Exception:  # noqa: BLE001 - gone: nothing to compare
                continue
            was = int(m.group(1))
            if type(now) is int and now != was and now >= 0 and was >= 0:
                cache.auto_dynamic_ints.add(expr)
                log.log("dynamic", "automatic dynamic: int %s changed (%d -> %d)", expr, was, now)


def _note_changed_sizes(cache: CodeCache, L, G):
    """Automatic dynamic: the input sizes that differ from an earlier compile's are marked
    dynamic for the next one (a recompile after a size change compiles them symbolic)."""
    for entry in cache.entries:
        cap = entry.capture
        for src, node in zip(cap.input_sources, cap.graph.placeholders):
            try:
                t = eval(src, {"torch": torch}, {"L": L, "G": G})
            except Exception:  # noqa: BLE001 - the input is gone: nothing to compare
                continue
            old = hints(node.meta["val"].shape)
            if not isinstance(t, torch.Tensor) or t.dim() != len(old):
                continue
            changed = {d for d in range(t.dim()) if t.shape[d] != old[d]}
            if changed - cache.auto_dynamic.get(src, set()):
                cache.auto_dynamic.setdefault(src, set()).update(changed)
                log.log("dynamic", "automatic dynamic: %s dims %s changed size (%s -> %s)", src,
                        sorted(changed), list(old), list(t.shape))
