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

from kiln.config import config
from kiln.runtime import pool


def prestart(target: str):
    """Start the build workers while lowering and codegen run (Triton on a GPU only)."""
    if target != "triton":
        return
    from kiln.runtime import triton_aot
    if triton_aot.supported() is None:
        p = pool.get_pool()
        if p is not None:
            from kiln.runtime.triton_load import ensure_triton_cache_dir
            ensure_triton_cache_dir()
            p.prestart(triton=True)


def load_kernels(kernels, target: str, launches: dict) -> list:
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
    return pool.run_jobs(load, kernels)


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
