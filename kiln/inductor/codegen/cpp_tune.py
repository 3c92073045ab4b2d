"""Chunk-size autotuning of C++ kernels (``KILN_AUTOTUNE=1`` only; ``runtime/autotune.py``).

A kernel whose outer OpenMP loop is parallel with the fixed schedule (static sizes, at least
``TUNE_MIN`` elements of work) is rewritten to take the chunk as a trailing ``kiln_chunk``
argument: ``-1`` runs the loop on one thread, ``0`` gives each thread one contiguous block (what
the default ``schedule(static)`` does), ``c > 0`` is ``schedule(static, c)``. Only the partition
of the outer (row) iterations changes, never an iteration's arithmetic, so every choice gives
the same bits. ``<name>_threads()`` reports the OpenMP thread count the choice is keyed by.
With the switch off this module is never called and the source is unchanged.
"""
from __future__ import annotations

import re

TUNE_MIN = 1 << 16
ROW_CHUNKS = (1, 8, 64)  # rows (or row tiles) per chunk
SIMD_CHUNKS = (1024, 8192)  # elements per chunk of a flat `parallel for simd` loop
_PRAGMAS = ("    #pragma omp parallel for", "    #pragma omp parallel for simd")
_LOOP = re.compile(r"    for \(int64_t (\w+) = 0; \1 < (\d+); \+\+\1\) \{$")


def tunable(gen):
    """gen with ``tune`` set to its chunk choices and its source rewritten, or gen unchanged."""
    if gen.sizes or not isinstance(gen.numel, int) or gen.numel < TUNE_MIN:
        return gen
    lines = gen.source.split("\n")
    at = [i for i, ln in enumerate(lines) if ln in _PRAGMAS]
    sig = [i for i, ln in enumerate(lines) if ln.startswith(f'extern "C" void {gen.name}(') and ln.endswith(") {")]
    if len(at) != 1 or len(sig) != 1 or at[0] + 1 >= len(lines):
        return gen
    loop = _LOOP.match(lines[at[0] + 1])
    if loop is None or int(loop.group(2)) < 2:
        return gen
    outer = int(loop.group(2))
    simd = lines[at[0]].endswith("simd")
    lines[sig[0]] = lines[sig[0]][:-len(") {")] + ", const int64_t kiln_chunk) {"
    lines[at[0]:at[0] + 1] = [
        "    const int64_t kiln_t = omp_get_max_threads();",
        f"    const int64_t kiln_c = kiln_chunk > 0 ? kiln_chunk : ({outer} + kiln_t - 1) / kiln_t;",
        lines[at[0]] + " schedule(static, kiln_c) if(kiln_chunk >= 0)"]
    lines.insert(sig[0], f'extern "C" int {gen.name}_threads(void) {{ return omp_get_max_threads(); }}')
    source = "#include <omp.h>\n" + "\n".join(lines)
    chunks = [c for c in (SIMD_CHUNKS if simd else ROW_CHUNKS) if c * 2 <= outer]
    gen.source = source
    gen.tune = {"cpp_chunks": [-1, 0] + chunks, "outer": outer}
    return gen
