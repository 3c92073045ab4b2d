"""The driver: one compile of one frame, top to bottom, one call per stage.

    compile_frame        a call of a CompiledFunction (kiln/api.py) that missed its cache
      capture            bytecode -> core graph + guards (+ the glue at a graph break)
      compile_graph      the graph stages, also the backward's and the interop backend's driver:
        meta             propagate_meta
        autograd         joint graph -> partition cache, else the partitioner -> forward +
                         backward graphs (autograd/); the forward goes on below now, the
                         backward at its first backward() (compile_backward)
        decomposition    decompose, dce, cse
        graph cache      a compiled graph from an earlier process (runtime/graph_cache.py)
        lowering         lower: prims -> loop IR
        scheduling       schedule: fusion into kernels
        codegen          Triton | C++ kernels, the Python wrapper
        build            runtime: gcc / Triton, disk cache
        wrap             writeback of mutated inputs
      wrap               CUDA graphs (mode="reduce-overhead")

kiln/observe follows a compile through the driver's events (``subscribe``), not through calls
from the stages.
"""
from __future__ import annotations

import functools
import os
import time

import torch

from kiln import api_args, autograd, context, counters, log
from kiln.autograd import speculate
from kiln.config import config
from kiln.context import run_pass
from kiln.eager_runs import note_eager_run
from kiln.graph import cse, dce, verify
from kiln.graph.graph import Graph
from kiln.graph.node import Node
from kiln.graph.propagate import propagate_meta
from kiln.ops.attention_masks import drop_all_true_masks
from kiln.ops.decompose import decompose
from kiln.capture.mutation import with_writeback


class StageError(RuntimeError):
    """An internal compiler error, tagged with the stage it happened in."""

    def __init__(self, stage: str, detail: str):
        super().__init__(f"kiln internal error in stage '{stage}': {detail}")
        self.stage = stage


class EagerGraph:
    """Runs a graph with the ops' eager torch implementations (backends eager, aot_eager)."""
    kernel_count = 0
    extern_count = 0
    wrapper_source = None

    def __init__(self, graph: Graph, why: str, strides=None):
        self.graph = graph
        self.why = why
        self.strides = strides  # eager's output strides, where the prims' eager forms differ

    def __call__(self, *inputs):
        outs = self.graph.run(*inputs)
        if not self.strides:
            return outs
        return tuple(_restrided(o, s) for o, s in zip(outs, self.strides)) + tuple(outs[len(self.strides):])


def _restrided(t, stride):
    if not isinstance(t, torch.Tensor) or stride is None or len(stride) != t.dim() or \
            not all(isinstance(s, int) for s in stride) or \
            all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride)):
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def output_strides(graph: Graph):
    """The strides the captured graph's metas give its tensor outputs (None for other values)."""
    out = graph.output_node.args[0]
    return [tuple(o.meta["val"].stride) if isinstance(o, Node) and hasattr(o.meta.get("val"), "stride")
            else None for o in out]


def promised_strides(graph: Graph):
    """The strides the graph's outputs must have: its metas' (``output_strides``), except where
    the graph carries strides promised before its inputs' layouts were known
    (``promised_output_strides``: a backward's grads keep the strides the partition gave them,
    eager's, whatever layouts the forward saved its tensors in)."""
    own = output_strides(graph)
    promised = getattr(graph, "promised_output_strides", None)
    if promised is None or len(promised) != len(own):
        return own
    return [p if p is not None and o is not None and len(p) == len(o) and
            all(isinstance(s, int) for s in p) else o for p, o in zip(promised, own)]


class CompiledGraph:
    """The kiln backend's result: a generated wrapper around generated kernels."""

    def __init__(self, call, wrapper_source: str, kernels, extern_count: int, target: str,
                 size_args=()):
        self.call = call
        # symbolic sizes the inputs do not give (a backward graph's): passed after the inputs
        self.size_args = list(size_args)
        self.wrapper_source = wrapper_source
        self.kernels = kernels
        self.kernel_count = len(kernels)
        self.extern_count = extern_count
        self.target = target

    def __call__(self, *inputs):
        return self.call(*inputs)


def _stage(stage, fn, ir, *args, **kwargs):
    try:
        return run_pass(stage, fn, ir, *args, **kwargs)
    except StageError:
        raise
    except Exception as e:
        raise StageError(stage, f"{fn.__name__}: {type(e).__name__}: {e}") from e



# ---------------------------------------------------------------------- events
# Observers of the driver, called in order as fn(event, ctx, **fields). Events: "started"
# (reason: why it recompiles, or None), "captured" (name, capture), "guards" (name, capture),
# "compiled" (compiled: the graph's result, or None where the compile stopped at capture), and
# the api's "recompiling" (ctx None, before the recompile's context opens: entries, L, G: the
# cache entries whose checks failed, the call's locals and globals). kiln/observe subscribes
# its logs and the KILN_DEBUG dump (kiln/observe/__init__.py); a subscriber ignores the events
# and fields it does not know.
SUBSCRIBERS: list = []
# Lists that get the context of every compile that starts (kiln.explain, the demo, tests)
RECORDERS: list[list] = context.RECORDERS  # kiln.explain's and the demo's (the bottom layer holds it)


def subscribe(fn):
    SUBSCRIBERS.append(fn)
    return fn


def emit(event: str, ctx, **fields):
    for fn in SUBSCRIBERS:
        fn(event, ctx, **fields)


@subscribe
def _record(event, ctx, reason=None, **_):
    """The driver's own subscriber, first: a started compile's context goes to the recorders."""
    if event == "started":
        if reason is not None:  # the dump and the report show why this recompile happened
            ctx.events.append({"kind": "recompile", "reason": reason})
        for rec in RECORDERS:
            rec.append(ctx)


# ---------------------------------------------------------------------- the driver
def compile_frame(frame, cache, L, args, kwargs, grad: bool, reason: str | None = None):
    """Compile the call ``frame(*args, **kwargs)`` (``frame``: an ``api.CompiledFunction``;
    ``L``: the call's locals; ``cache``: its code's ``api.CodeCache``). Returns the cache entry
    the call runs, or None (it runs eagerly). Fallbacks are the frame's: ``frame._capture``
    stops at capture, ``frame._internal_error`` makes an entry that runs eagerly."""
    with context.compiling(frame.name) as ctx:
        emit("started", ctx, reason=reason)
        t0 = time.perf_counter()
        # capture: bytecode -> core graph + guards (+ the glue at a graph break)
        capture, stopped = frame._capture(cache, ctx, L, args, kwargs, grad, reason)
        if capture is None:
            return stopped
        needed = capture.break_state is None or bool(capture.graph.output_node.args[0])
        if needed:  # a prefix that computes nothing the rest needs is no graph
            ctx.record("capture", "captured_graph", capture.graph)
        ctx.guards.extend(capture.guards)
        emit("captured", ctx, name=frame.name, capture=capture)
        # meta -> autograd -> decomposition -> graph cache -> lowering -> scheduling -> codegen
        # -> build -> writeback
        try:
            compiled = _compile_captured(frame, capture, L) if needed else None
        except StageError as e:
            return frame._internal_error(cache, e, e.__cause__ or e, L, capture, grad)
        except Exception as e:  # noqa: BLE001 - the meta verifier found a wrong meta
            return frame._internal_error(cache, StageError("meta", f"{type(e).__name__}: {e}"), e,
                                         L, capture, grad)
        _final_guards(frame.name, ctx, capture)
        # wrap: CUDA graphs
        if frame.mode in api_args.CUDAGRAPH_MODES and compiled is not None:
            from kiln.runtime import cudagraphs  # CUDA graphs need torch.cuda: only when asked
            compiled = cudagraphs.wrap(compiled, capture.graph, frame.name,
                                       dynamic=capture.shape_env is not None)
        entry = frame._add_entry(cache, capture, compiled, grad, ctx.compile_id)
        total = time.perf_counter() - t0
        log.log("perf", "compiled %s in %.1f ms: %s", frame.name, total * 1e3,
                ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in ctx.stage_times.items()))
        emit("compiled", ctx, compiled=compiled)
        return entry


def _compile_captured(frame, capture, L):
    """The graph stages for a captured frame, with the frame's options (``frame.compile_graph``:
    ``compile_graph``, or kiln.distributed's split at DDP buckets)."""
    if config.verify:
        from kiln.graph.verify_meta import verify_meta
        context.run_pass("meta", verify_meta, capture.graph, capture.fetch(L))
    if api_args.autotune(frame.mode, frame.options) and not config.triton_autotune:
        with config.patch(triton_autotune=True):
            return frame.compile_graph(capture.graph, frame.backend)
    return frame.compile_graph(capture.graph, frame.backend)


def _final_guards(name, ctx, capture):
    if capture.shape_env is not None:
        # later stages may have recorded guards on symbolic sizes too
        capture.refresh_guards()
        ctx.guards[:] = capture.guards
        ctx.record("capture", "guards", capture.guard_source)
        ctx.record("capture", "shape_env", "\n".join(capture.shape_env.describe()))
        log.log("dynamic", "shape guards of %s:\n  %s", name,
                "\n  ".join(capture.shape_env.guard_lines()) or "(none)")
    emit("guards", ctx, name=name, capture=capture)


def compile_graph(graph: Graph, backend: str = "kiln"):
    """The graph stages: a captured graph of core ops -> a callable taking the graph's inputs.
    A captured graph that mutates its inputs (``graph.input_mutations``, set by capture) gets
    them written back after each call (``capture.mutation.WritebackGraph``)."""
    compiled = _compile_graph(graph, backend)
    if getattr(graph, "input_mutations", None):  # wrap: the writeback
        compiled = with_writeback(compiled, graph)
    return compiled


def _compile_graph(graph: Graph, backend: str):
    graph = _stage("meta", propagate_meta, graph)
    if config.verify:
        _stage("meta", verify, graph, ("core", "prims"), name="verify_captured")
    if backend == "eager":
        return EagerGraph(graph, "backend='eager'")
    if any(getattr(getattr(n.meta.get("val"), "device", None), "type", None) == "meta" for n in graph.nodes):
        return EagerGraph(graph, "tensors on the meta device have no data to compute on")
    graph = _stage("decomp", drop_all_true_masks, graph)
    if needs_autograd(graph):
        return compile_training(graph, backend)
    prims_graph = _stage("decomp", decompose, graph)
    prims_graph = _stage("decomp", dce, prims_graph)
    prims_graph = _stage("decomp", cse, prims_graph)
    # eager's strides for the outputs, from the captured graph's metas: lowering allocates
    # them so (the prims' own metas are contiguous)
    prims_graph.output_strides = promised_strides(graph)
    # a training forward (compile_training): its saved tensors keep the layouts the
    # backward was built against, or (a channels-last conv graph) the layouts lowering gives
    # them, for which the backward is then compiled (inductor/conv_layout.py)
    prims_graph.saves_for_backward = getattr(graph, "saves_for_backward", False)
    prims_graph.saved_outputs_from = getattr(graph, "saved_outputs_from", None)
    if config.verify:
        _stage("decomp", verify, prims_graph, ("prims",), name="verify_prims")
    if backend == "aot_eager":
        return EagerGraph(prims_graph, "backend='aot_eager'", prims_graph.output_strides)
    if backend != "kiln":
        raise ValueError(f"unknown backend {backend!r}; expected 'eager', 'aot_eager' or 'kiln'")
    return compile_prims_graph(prims_graph)


# ---------------------------------------------------------------------- autograd
def compile_training(graph: Graph, backend: str, strategy: str | None = None):
    """The autograd stage: the joint graph, cut (partition cache, then the partitioner) into a
    forward and a backward graph. The forward goes through the stages after autograd now (its
    placeholders never require grad: no recursion); the backward at its first ``backward()``,
    or in a speculation thread while the forward builds (``compile_backward``). Returns a
    ``CompiledAutograd``, or the forward alone when no output can carry a gradient."""
    strategy = strategy or autograd.config_strategy()
    joint = _stage("autograd", autograd.build_joint, graph)
    if config.verify:
        _stage("autograd", verify, joint.graph, ("core",), name="verify_joint")
    part = _stage("autograd", partition_cached, joint, strategy, graph.name, name="partition")
    ctx = context.current()
    if ctx is not None:
        ctx.record("autograd", "joint_graph", joint.graph)
        ctx.record("autograd", "forward_graph", part.forward)
        ctx.record("autograd", "backward_graph", part.backward)
    if config.verify:
        _stage("autograd", verify, part.forward, ("core",), name="verify_forward")
        _stage("autograd", verify, part.backward, ("core",), name="verify_backward")
    autograd.log_partition(graph.name, part)
    compile_id = None if ctx is None else ctx.compile_id
    backward = functools.partial(compile_backward, name=graph.name, backend=backend, compile_id=compile_id)
    trains = bool(part.grad_input_indices) and any(part.diff_outputs)
    spec = None
    if trains and speculate.eligible([n.meta["val"] for n in part.forward.placeholders], bool(RECORDERS)):
        spec = speculate.BackwardSpeculation(graph.name, part, backward)
        speculate.before_forward_build(spec)
    part.forward.saves_for_backward = trains  # lowering keeps the saved tensors' layouts
    part.forward.saved_outputs_from = part.num_user_outputs  # the outputs after the user's are saved
    try:
        forward = compile_graph(part.forward, backend)
    finally:
        if spec is not None and ctx is not None and spec.start in ctx.before_build:
            ctx.before_build.remove(spec.start)
    return autograd.runtime(graph.name, part, forward, backward, spec)


def partition_cached(joint, strategy, name):
    """The partition, with the strategy's answer from the partition cache when an earlier
    process already cut this joint graph (runtime/graph_cache.py: ``partition_key``)."""
    from kiln.runtime import graph_cache

    if not graph_cache.enabled():
        return autograd.partition(joint, strategy, name)
    key = graph_cache.partition_key(joint, strategy)
    saved = graph_cache.load_plan(key, joint)
    if saved is not None:
        try:
            part = autograd.partition(joint, strategy, name, saved=saved)
        except AssertionError as e:  # the saved set does not cover what the backward reads
            graph_cache.drop_plan(key, str(e))
        else:
            counters.bump("partition_cache_hits")
            log.log("cache", "partition of %s from disk (%d saved)", name, len(saved))
            return part
    part = autograd.partition(joint, strategy, name)
    graph_cache.store_plan(key, part.saved)
    return part


def compile_backward(graph: Graph, *, name: str, backend: str, compile_id):
    """A backward graph (autograd's, with its inputs' real metas) through the graph stages,
    in a compile context of its own; an eager-ops graph, with a warning, when a stage fails
    (an error under ``strict``)."""
    with context.compiling(f"{name}_backward") as ctx:
        ctx.record("autograd", "backward_graph", graph)
        emit("started", ctx)  # kiln.explain around a training step sees the backward too
        ctx.events.append({"kind": "backward_of", "compile_id": compile_id})
        try:
            with torch.no_grad():
                compiled = compile_graph(graph, backend)
        except StageError as e:
            counters.bump("fallbacks")
            if config.strict:
                raise
            note_eager_run(f"internal error: {e}; the backward graph runs with eager torch ops",
                           name=f"{name}_backward")  # noted once, when the backward compiles
            compiled = EagerGraph(graph, f"backward fallback: {e}")
        emit("compiled", ctx, compiled=compiled)  # the backward's own dump folder
    log.log("aot", "compiled the backward of %s (%s)", name, type(compiled).__name__)
    return compiled


# ---------------------------------------------------------------------- after autograd

def needs_autograd(graph: Graph) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(n.meta["val"].requires_grad for n in graph.placeholders)


def choose_target(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if config.cpu_backend == "triton":
        if os.environ.get("TRITON_INTERPRET", "0") != "1":
            raise StageError("codegen", "cpu_backend='triton' needs TRITON_INTERPRET=1 set before triton is imported")
        return "triton"
    return "cpp"


def compile_prims_graph(prims_graph: Graph) -> CompiledGraph:
    """The stages after decomposition: graph cache -> lowering -> scheduling -> codegen -> build."""
    from kiln.inductor.codegen.wrapper import generate_wrapper
    from kiln.inductor.lower import lower
    from kiln.inductor.scheduler import schedule
    from kiln.runtime import graph_cache
    from kiln.runtime.builder import prestart

    device = _graph_device(prims_graph)
    key = graph_cache.graph_key(prims_graph, choose_target(device)) if graph_cache.enabled() else None
    if key is not None:  # graph cache: a compiled graph from an earlier process, no codegen, no builds
        hit = _cached_graph(prims_graph, device, key)
        if hit is not None:
            return hit
    prestart(choose_target(device))  # build workers start while lowering and codegen run
    program = _stage("lowering", lower, prims_graph)
    ctx = context.current()
    if ctx is not None:  # read by the backward's speculation (autograd/speculate.py)
        ctx.output_strides = [tuple(o.stride) if hasattr(o, "stride") else None for o in program.outputs]
    sched = _stage("scheduling", schedule, program)
    target = choose_target(program.device)
    generated = _stage("codegen", generate_kernels, sched, target)
    wrapper = _stage("codegen", generate_wrapper, sched, generated, target)
    launches = _aot_launches(prims_graph, program, generated, target)
    call = _stage("build", build, wrapper, generated, target, launches)
    if key is not None and target == choose_target(device):  # graph cache: for the next process
        graph_cache.store(key, wrapper, generated, len(sched.externs), launches)
    if log.enabled("output_code"):
        log.log("output_code", "wrapper:\n%s", wrapper.source)
        for k in generated.values():
            log.log("output_code", "kernel %s:\n%s", k.name, k.source)
    return _compiled(prims_graph, program.device, call, wrapper, list(generated.values()),
                     len(sched.externs), target)


def _cached_graph(prims_graph: Graph, device, key: str) -> CompiledGraph | None:
    """The graph cache's entry for ``key``, built (its kernels from the disk cache); None on a
    miss, or where the entry does not build (then it is evicted)."""
    from kiln.runtime import graph_cache

    hit = graph_cache.load(key)
    if hit is None:
        return None
    target = choose_target(device)
    try:
        call = _stage("build", build, hit, {k.name: k for k in hit.kernels}, target)
    except StageError as e:  # its digest matched, yet it does not build: heal it
        graph_cache.evict(key, str(e))
        return None
    counters.bump("graph_cache_hits")
    log.log("cache", "compiled graph %s from disk (%d kernels)", key[:12], len(hit.kernels))
    compiled = _compiled(prims_graph, device, call, hit, hit.kernels, hit.extern_count, target)
    return _heal_on_first_call(compiled, prims_graph, key)


def _heal_on_first_call(compiled: CompiledGraph, prims_graph: Graph, key: str) -> CompiledGraph:
    """A graph from the cache whose first call raises (a wrapper whose digest matched but which
    is wrong) is evicted, compiled afresh and called again: the caller gets a compiled result,
    and the next process a good entry. After one good call the wrapper runs unguarded: the
    guard puts the plain call back into the CompiledGraph and into whatever took it
    (``holders``: the call path's cache entries)."""
    cached = compiled.call
    state = {"fresh": None}

    def first_call(*args):
        if state["fresh"] is not None:
            return state["fresh"](*args)
        try:
            out = cached(*args)
        except Exception as e:  # noqa: BLE001 - one rebuild; a fresh graph's error propagates
            from kiln.runtime import graph_cache
            graph_cache.evict(key, f"its first call raised {type(e).__name__}: {e}")
            fresh = compile_prims_graph(prims_graph)  # misses the evicted entry, stores a good one
            if list(fresh.size_args) != list(compiled.size_args):
                raise
            state["fresh"] = fresh.call
            _settle(compiled, fresh.call, fresh.wrapper_source)
            return fresh.call(*args)
        _settle(compiled, cached, compiled.wrapper_source)
        return out
    compiled.call = first_call
    compiled.holders = []
    return compiled


def _settle(compiled: CompiledGraph, call, source):
    compiled.call, compiled.wrapper_source = call, source
    for holder in getattr(compiled, "holders", ()):
        holder.call = call
    compiled.holders = []


def _compiled(prims_graph, device, call, wrapper, kernels, extern_count, target) -> CompiledGraph:
    ctx = context.current()
    if ctx is not None:
        ctx.kernel_count += len(kernels)
        ctx.extern_calls += extern_count
        ctx.kernels.extend(kernels)
    counters.bump("kernels_generated", len(kernels))
    constants = _graph_constants(prims_graph, device)
    nsizes = len(wrapper.size_args)
    if constants and nsizes:
        inner = call

        def call(*args):  # inputs, then sizes; the wrapper takes the constants between
            return inner(*args[:-nsizes], *constants, *args[-nsizes:])
    elif constants:
        inner = call

        def call(*inputs):
            return inner(*inputs, *constants)
    compiled = CompiledGraph(call, wrapper.source, list(kernels), extern_count, target, wrapper.size_args)
    compiled.input_outputs = _input_outputs(prims_graph)
    return compiled


def _input_outputs(prims_graph) -> frozenset:
    """Positions of the graph's outputs that are its inputs themselves: a view or detach that
    decomposition folded away (``x.detach()``, ``x[0:]``) returns the input object, where eager
    returns a new tensor; the call path makes those fresh aliases (api.CacheEntry)."""
    outs = prims_graph.output_node.args[0]
    return frozenset(i for i, n in enumerate(outs) if _returns_input(n))


# prims that only re-index their operand (lowering makes them views of it); core ops say so
# with their ``view`` attribute
_VIEW_PRIMS = frozenset({"permute", "reshape", "broadcast_in_dim", "slice", "select", "as_strided",
                         "squeeze", "unsqueeze", "expand", "view", "alias"})


def _is_view(target) -> bool:
    return getattr(target, "view", None) is not None or getattr(target, "name", None) in _VIEW_PRIMS


def _returns_input(node) -> bool:
    """The output is an input, or a chain of views back to one with the input's own shape and
    strides (``x.t().t()``): the wrapper then hands back the input object. Counting a view that
    is not one costs only a second alias of a new object."""
    base = node
    while isinstance(base, Node) and base.op != "placeholder" and base.args and _is_view(base.target) \
            and isinstance(base.args[0], Node):
        base = base.args[0]
    if not (isinstance(base, Node) and base.op == "placeholder"):
        return False
    a, b = node.meta.get("val"), base.meta.get("val")
    return base is node or (getattr(a, "shape", None) == getattr(b, "shape", 0)
                            and getattr(a, "stride", None) == getattr(b, "stride", 0))


def _graph_device(graph: Graph) -> torch.device:
    from kiln.inductor.lower import graph_device
    return graph_device(graph)


def _aot_launches(prims_graph, program, generated: dict, target: str) -> dict:
    """Ahead-of-time build requests of the Triton kernels (runtime/triton_aot.py): only when
    compiling for a real GPU with a build pool."""
    if target != "triton" or len(generated) < 1:
        return {}
    from kiln.runtime import pool, triton_aot
    why = triton_aot.supported()
    if why is not None or pool.pool_size() <= 1:
        log.log("kernels", "Triton kernels compile at their first launch: %s",
                why or "KILN_COMPILE_THREADS=1")
        return {}
    buffers = program.all_buffers()
    hints = triton_aot.symbol_hints(prims_graph)
    out = {}
    for k in generated.values():
        req = triton_aot.describe(k, buffers, hints)
        if req is not None:
            out[k.name] = req
    return out


def _graph_constants(graph: Graph, device) -> list:
    """Tensors the graph holds itself (``get_attr``), in the order lowering made them inputs.
    A 0-d constant made on the CPU is a scalar to torch: it moves to the graph's device."""
    out = []
    for node in graph.nodes:
        if node.op == "get_attr":
            t = graph.constants[node.target]
            if t.device != device and t.dim() == 0:
                t = t.to(device)
            out.append(t)
    return out


def generate_kernels(sched, target: str) -> dict:
    from kiln.inductor.codegen.cpp import generate_cpp
    from kiln.inductor.codegen.triton import generate_triton

    from kiln.inductor.codegen.scatter import generate_scatter
    from kiln.inductor.scheduler import ScatterStep

    buffers = sched.program.all_buffers()
    gen = generate_triton if target == "triton" else generate_cpp
    return {k.name: generate_scatter(k, buffers, target) if isinstance(k, ScatterStep) else gen(k, buffers)
            for k in sched.kernels}


def build(wrapper, generated: dict, target: str, launches=None):
    """Build every kernel (concurrently, in the build pool: Triton kernels ahead of time in its
    worker processes, gcc in its threads) and exec the wrapper."""
    from kiln.runtime.builder import load_kernels, representatives

    ctx = context.current()
    if ctx is not None and ctx.before_build:
        hooks, ctx.before_build = ctx.before_build, []
        for hook in hooks:
            hook()
    kernels = list(generated.values())
    # kernels share a binary by source and launch specialization; a graph from the cache has
    # no AOT requests, so its kernels' recorded ones decide (else kernels that differ only in
    # their launch share one JIT function, whose binary-record key is the other kernel's, and
    # a warm start launches them through the JIT)
    specs = launches or {k.name: k.launch for k in kernels if getattr(k, "launch", None)}
    reps = representatives(kernels, specs)
    loaded = load_kernels(kernels, target, launches or {}, reps)
    from kiln.inductor.codegen.wrapper import ensure_layout, kernel_error

    from kiln.runtime.launch import line_of
    namespace = {"torch": torch, "empty_strided": torch.empty_strided, "as_strided": torch.as_strided,
                 "ensure_layout": ensure_layout, "kernel_error": kernel_error, "launch_line": line_of}
    for k, rep, fn in zip(kernels, reps, loaded):
        namespace[k.name] = fn
        if getattr(k, "checked", False):
            from kiln.runtime.cpp_build import load_cpp_checker
            namespace[f"{k.name}_check"] = load_cpp_checker(rep.source, rep.name)
    for ext in wrapper.externs:
        op = getattr(ext, "op", ext)  # an Extern step, or (from the graph cache) the op itself
        namespace[f"extern_{op.name}"] = op.eager
    exec(compile(wrapper.source, "<kiln wrapper>", "exec"), namespace)
    from kiln.runtime import profiler_regions
    profiler_regions.register(namespace["call"], [k.name for k in kernels])  # named in torch.profiler traces
    return namespace["call"]
