"""The build stage's kernel loading: every kernel of a compile, built or found in the caches.

- C++: each kernel's shared object from memory, the disk cache, or gcc; gcc runs in the build
  pool's threads (it is a subprocess), ``k/n`` progress on a terminal.
- Triton: with a real GPU and a pool, and at least ``config.aot_min_kernels`` kernels, every
  kernel is compiled ahead of time in the pool's worker processes (``triton_aot.py``; fewer
  kernels compile lazily in-process at first launch, which is faster than a round trip through
  a worker for one or two kernels); then each kernel's module is imported and wrapped in a
  ``launch.FastLauncher``, whose first launch finds the binary in Triton's disk cache.
"""
from __future__ import annotations

import re
import threading

from kiln import counters, log
from kiln.config import config
from kiln.runtime import pool

_FROM_LINE = re.compile(r"^[ \t]*(#|//) from: .*\n?", re.M)


def canonical_source(source: str, name: str) -> str:
    """A kernel's source up to its name and its "from:" origin comments: kernels equal here
    (the same layer repeated twelve times) build one binary."""
    return re.sub(re.escape(name) + r"(?![0-9A-Za-z])", "KILN_KERNEL", _FROM_LINE.sub("", source))


def representatives(kernels, launches: dict) -> list:
    """For each kernel, the first kernel of the list that builds the same binary: the same
    canonical source and, for Triton, the same launch specialization (argument dtypes, integer
    values, constexprs). A tuned kernel shares with one whose every variant source is the same
    up to names, with the same configs and launch sizes: the twelve copies of a layer's kernel
    then tune once and share the choice (one tuner object), instead of compiling and timing
    every config twelve times."""
    first: dict = {}
    out = []
    for k in kernels:
        tune = getattr(k, "tune", None)
        if tune is not None:
            out.append(first.setdefault(_tuned_key(k, tune), k))
            continue
        req = launches.get(k.name)
        spec = None if req is None else repr((req.get("args"), sorted(req.get("kwargs", {}).items())))
        out.append(first.setdefault((canonical_source(k.source, k.name), spec), k))
    shared = sum(1 for k, r in zip(kernels, out) if k is not r)
    if shared:
        log.log("kernels", "%d of %d kernels share another kernel's binary (same source up to names "
                "and origins)", shared, len(kernels))
    return out


def _tuned_key(k, tune) -> tuple:
    import json
    if hasattr(tune, "variants"):  # Triton: autotune.TuneSpec
        return ("tuned", tuple((canonical_source(src, k.name), json.dumps(cfgs, sort_keys=True))
                               for src, cfgs in tune.variants), repr(tuple(tune.scalars)))
    return ("tuned-cpp", canonical_source(k.source, k.name), json.dumps(tune, sort_keys=True, default=str))


EARLY_WORKERS = 4  # started before capture; the rest once a compile misses the graph cache


def prestart(target: str, count: int | None = None):
    """Start the build workers (all, or ``count`` of them) while lowering and codegen run
    (Triton on a GPU only), and warm the parent's own Triton setup in a thread."""
    if target != "triton":
        return
    from kiln.runtime import triton_aot
    if triton_aot.supported() is None:
        p = pool.get_pool()
        if p is not None:
            from kiln.runtime.triton_load import ensure_triton_cache_dir
            ensure_triton_cache_dir()
            p.prestart(triton=True, count=count)
            # a compile that missed the graph cache: its first launches may go through the JIT
            # (kernels too few to build ahead) and need Triton's cache key. A graph from the
            # cache launches from kiln's binary records, which need no Triton cache key.
            warm_triton(key=count is None or not config.triton_binary_records)


_warm_lock = threading.Lock()
_warm_threads: dict = {}  # "driver" / "key" -> the thread that warms it


def warm_triton(key: bool = True):
    """Warm, in threads, what the parent's first Triton use would otherwise pay on the critical
    path of a compile:

    - the driver: Triton's CUDA driver object builds its C helper module (``cuda_utils``) with
      the C compiler when the Triton cache lacks it (most of a second, between codegen and the
      first build request), else loads it. gcc is a subprocess, so the
      thread runs beside capture, lowering and codegen. ``wait_triton_driver`` joins it before
      the parent touches the driver itself (two threads would both create one);
    - with ``key``, Triton's own cache key, which hashes its sources and libraries (0.36-0.6 s)
      at the process's first JIT launch, with the GIL released."""
    if not config.triton_warm:
        return
    def driver():
        try:
            from triton.runtime import driver as d
            d.active  # noqa: B018 - creates the driver and its utils module
        except Exception:  # noqa: BLE001 - the parent's own first use reports any trouble
            pass

    def cache_key():
        try:
            from triton.runtime.cache import triton_key
            triton_key()
        except Exception:  # noqa: BLE001 - a Triton without it; the first launch does its own
            pass
    with _warm_lock:
        for name, fn, wanted in (("driver", driver, True), ("key", cache_key, key)):
            if wanted and name not in _warm_threads:
                t = threading.Thread(target=fn, name=f"kiln-triton-{name}", daemon=True)
                _warm_threads[name] = t
                t.start()


def wait_triton_driver():
    """Before the parent uses Triton's driver: let a warming thread finish creating it."""
    t = _warm_threads.get("driver")
    if t is not None and t is not threading.current_thread():
        t.join()


def prestart_if_gpu():
    """At a compile's start, before capture: a process that already uses CUDA starts its
    Triton build workers now. A worker's imports take about a second (several with 16 of them
    starting at once), which capture, lowering and codegen then hide."""
    import torch
    if torch.cuda.is_initialized():
        # a few only: a graph found in the graph cache builds nothing, and the workers' imports
        # would compete with the parent's capture; a miss starts the rest (pipeline.py)
        prestart("triton", count=EARLY_WORKERS)


def load_kernels(kernels, target: str, launches: dict, reps=None) -> list:
    """The loaded function of each kernel; kernels with one representative (see
    ``representatives``) build and load once."""
    reps = representatives(kernels, launches) if reps is None else reps
    unique = list({id(r): r for r in reps}.values())
    loaded = dict(zip((id(r) for r in unique), _load_unique(unique, target, launches)))
    if target != "triton":
        return [loaded[id(r)] for r in reps]
    from kiln.runtime import launch
    # a launcher binds to its own launch line, so each kernel keeps its own around the shared JIT
    return [loaded[id(r)] if k is r or not isinstance(loaded[id(r)], launch.FastLauncher)
            else launch.wrap(loaded[id(r)].fn, k.name) for k, r in zip(kernels, reps)]


def _load_unique(kernels, target: str, launches: dict) -> list:
    if target == "triton":
        return _load_triton(kernels, launches)
    from kiln.runtime.cpp_build import load_cpp_function

    def load(k):
        nsizes = len(getattr(k, "sizes", ()))
        tune = getattr(k, "tune", None)
        if tune is None:
            return load_cpp_function(k.source, k.name, len(k.args), nsizes)
        from kiln.runtime.autotune import CppAutotuned
        from kiln.runtime.cpp_build import load_cpp_threads
        fn = load_cpp_function(k.source, k.name, len(k.args), nsizes + 1)  # + kiln_chunk
        return CppAutotuned(k.name, k.source, fn, load_cpp_threads(k.source, k.name), tune["cpp_chunks"], nsizes)
    from kiln.runtime import cpp_pch
    from kiln.runtime.cpp_build import CompilerCrash, build_missing
    builds = counters.counters["kernel_builds"]
    try:  # several kernels to one gcc run; on any trouble each kernel builds alone below
        build_missing([k.source for k in kernels], pool.pool_size())
    except CompilerCrash:
        raise  # a compiler that hung or was killed would do it again once per kernel
    except Exception as e:  # noqa: BLE001
        log.log("kernels", "batched C++ build failed (%s: %s); building each kernel alone", type(e).__name__, e)
    out = pool.run_jobs(load, kernels)
    if counters.counters["kernel_builds"] != builds:  # gcc ran: the next builds can use a header
        cpp_pch.after_builds()
    return out


def _load_triton(kernels, launches: dict) -> list:
    from kiln.runtime import launch
    from kiln.runtime.triton_load import load_triton

    if launches and len(kernels) >= config.aot_min_kernels:
        p = pool.get_pool()
        if p is not None:
            from kiln.runtime.triton_aot import build_ahead
            build_ahead(kernels, launches, p)
    out = []
    for k in kernels:
        tune = getattr(k, "tune", None)
        fn = load_triton(k.source, k.name, tune=tune)
        out.append(fn if tune is not None else launch.wrap(fn, k.name))
    return out
