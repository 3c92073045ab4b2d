"""Autotuning of generated Triton kernels.

Codegen offers, per kernel, a few *variants* (sources: a reduction's persistent and looped
forms) and for each a small set of launch configs (``XBLOCK``, ``RBLOCK``, ``num_warps``). On
the first call, ``Autotuned`` launches every (variant, config) on the call's real arguments,
times them, and keeps the fastest; the choice is written to the disk cache under
``<cache>/autotune``, keyed by the variants' sources, the launch sizes and the device name, so
later processes skip the search. A kernel that writes its result over a buffer it reads (the
wrapper's in-place writes: the same tensor passed as an input and an output) is timed on a
copy of that buffer, so only the real launch after the search writes over it; every other
generated kernel only writes its outputs from its inputs (scatter kernels, which accumulate in
place, are never tuned), so launching it several times is harmless.

Tuning runs on CUDA; under the Triton interpreter codegen keeps its heuristic config unless
``config.triton_autotune == "interpret"`` (used by tests, timed with perf_counter).

C++ kernels (``CppAutotuned``, below) tune their OpenMP chunk size under the same switch.
"""
from __future__ import annotations

import json
import os
import threading
import time

from kiln import log
from kiln.inductor.codegen.tuning import TuneSpec, cpp_enabled, enabled  # noqa: F401 (codegen's side)
from kiln.runtime import cache

_lock = threading.Lock()


def _device_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu-interpreter"


def _launch(fn, cfg, args, xnumel):
    grid = (-(-xnumel // cfg["XBLOCK"]),)
    consts = {k: v for k, v in cfg.items() if k != "num_warps"}
    fn[grid](*args, **consts, num_warps=cfg["num_warps"])


def _scratch_for_aliased(args):
    """args with every tensor that appears more than once (an in-place write) replaced, in
    each position, by one copy of it: the search's launches then leave the real one alone."""
    import torch
    seen: dict = {}
    for a in args:
        if isinstance(a, torch.Tensor):
            seen[a.data_ptr()] = seen.get(a.data_ptr(), 0) + 1
    if all(n == 1 for n in seen.values()):
        return args
    copies: dict = {}

    def scratch(a):
        if not isinstance(a, torch.Tensor) or seen[a.data_ptr()] == 1:
            return a
        if a.data_ptr() not in copies:
            copies[a.data_ptr()] = torch.empty_like(a).copy_(a)  # (same strides: empty_like keeps them for dense tensors)
        c = copies[a.data_ptr()]
        return c if (c.shape, c.stride()) == (a.shape, a.stride()) else c.as_strided(a.shape, a.stride())
    return tuple(scratch(a) for a in args)


class Autotuned:
    """Callable as ``kernel.run(*pointers_and_scalars)``: picks its config on the first call."""

    def __init__(self, spec: TuneSpec, fns):
        self.spec, self.fns = spec, fns
        self.choice = None
        self.line = None  # the chosen config's launch line (runtime/launch.py)
        self.key = cache.content_key(*(src for src, _ in spec.variants), repr(spec.scalars),
                                     json.dumps([cfgs for _, cfgs in spec.variants]), _device_name())
        self.path = os.path.join(cache.subdir("autotune"), self.key[:2], self.key + ".json")

    def _load(self):
        try:
            with cache.reading(self.path) as ok:
                if not ok:
                    return None
                with open(self.path) as f:
                    v, cfg = json.load(f)
            if 0 <= v < len(self.fns):
                return v, cfg
        except (OSError, ValueError, TypeError):
            pass
        return None

    def _time(self, fn, cfg, args):
        import torch
        xnumel = self.spec.scalars[0]
        if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") == "1":
            from triton.testing import do_bench
            return do_bench(lambda: _launch(fn, cfg, args, xnumel), warmup=5, rep=20)
        t = time.perf_counter()
        _launch(fn, cfg, args, xnumel)
        return time.perf_counter() - t

    def tune(self, args):
        args = _scratch_for_aliased(args)
        results = []
        for v, ((_, cfgs), fn) in enumerate(zip(self.spec.variants, self.fns)):
            for cfg in cfgs:
                try:
                    _launch(fn, cfg, args, self.spec.scalars[0])  # compile outside the timing
                    results.append((self._time(fn, cfg, args), v, cfg))
                    log.detail("autotune", "%s: variant %d %s took %.3g", self.spec.name, v, cfg, results[-1][0])
                except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
                    log.log("autotune", "%s: config %s of variant %d failed: %s", self.spec.name, cfg, v, e)
        if not results:
            raise RuntimeError(f"[autotune] no config of {self.spec.name} ran")
        results.sort(key=lambda r: r[0])
        t, v, cfg = results[0]
        log.log("autotune", "%s: chose variant %d %s (%.3g) of %d configs", self.spec.name, v, cfg, t, len(results))
        self.path = os.path.join(cache.subdir("autotune"), self.key[:2], self.key + ".json")  # (root may have moved)
        cache.store(self.path, json.dumps([v, cfg]).encode())
        return v, cfg

    def run(self, *args):
        line = self.line
        if line is None:
            if self.choice is None:
                self.choice = self._load() or self.tune(args)
            v, cfg = self.choice
            xnumel = self.spec.scalars[0]
            if not isinstance(xnumel, int):
                return _launch(self.fns[v], cfg, args, xnumel)
            from kiln.runtime.launch import line_of
            consts = {k: x for k, x in cfg.items() if k != "num_warps"}
            line = self.line = line_of(self.fns[v], (-(-xnumel // cfg["XBLOCK"]),), **consts,
                                       num_warps=cfg["num_warps"])
        line(*args)


# ---------------------------------------------------------------------- C++ chunk sizes
REPEATS = 5
cpp_stats = {"tuned": 0, "disk_hits": 0}  # tests read these


class CppAutotuned:
    """A C++ kernel taking a trailing ``kiln_chunk`` (``codegen/cpp_tune.py``), called like the
    untuned one: on the first call with a thread count it times every chunk choice on the real
    arguments (one warm-up, then the median of ``REPEATS`` runs), keeps the fastest, and caches
    it under ``<cache>/autotune`` keyed by the source, the sizes and the thread count."""

    def __init__(self, name, source, fn, threads, choices, nsizes):
        self.name, self.source, self.fn, self.threads = name, source, fn, threads
        self.choices, self.nsizes = list(choices), nsizes
        self.chosen: dict[int, int] = {}

    def _path(self, threads, sizes):
        key = cache.content_key(self.source, repr(sizes), str(threads), json.dumps(self.choices), "cpp-chunk")
        return os.path.join(cache.subdir("autotune"), key[:2], key + ".json")

    def _pick(self, args, threads):
        sizes = tuple(args[len(args) - self.nsizes:]) if self.nsizes else ()
        path = self._path(threads, sizes)
        try:
            chunk = None
            with cache.reading(path) as ok:
                if ok:
                    with open(path) as f:
                        chunk = json.load(f)
            if chunk in self.choices:
                cpp_stats["disk_hits"] += 1
                log.log("autotune", "%s: chunk %d from the cache (%d threads)", self.name, chunk, threads)
                return chunk
        except (OSError, ValueError, TypeError):
            pass
        results = []
        for chunk in self.choices:
            self.fn(*args, chunk)  # warm-up: pages touched, caches filled
            times = []
            for _ in range(REPEATS):
                t = time.perf_counter()
                self.fn(*args, chunk)
                times.append(time.perf_counter() - t)
            results.append((sorted(times)[REPEATS // 2], chunk))
            log.detail("autotune", "%s: chunk %d took %.3g", self.name, chunk, results[-1][0])
        t, chunk = min(results)
        cpp_stats["tuned"] += 1
        log.log("autotune", "%s: chose chunk %d (%.3g s; -1 serial, 0 one block per thread) of %d, %d threads",
                self.name, chunk, t, len(results), threads)
        cache.store(self._path(threads, sizes), json.dumps(chunk).encode())  # (root may have moved)
        return chunk

    def __call__(self, *args):
        threads = self.threads()
        chunk = self.chosen.get(threads)
        if chunk is None:
            with _lock:
                chunk = self.chosen[threads] = self._pick(args, threads)
        self.fn(*args, chunk)
