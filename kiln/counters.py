"""Process-wide counters, read with ``kiln.stats()``."""
from __future__ import annotations

import collections

COUNTER_NAMES = ("frames_compiled", "recompiles", "graph_breaks", "kernels_generated",
                 "cache_hits", "disk_cache_hits", "fallbacks", "eager_runs", "graphs_compiled",
                 "kernel_builds", "graph_cache_hits", "partition_cache_hits",
                 # first launches of Triton kernels: from kiln's binary records, through Triton's JIT
                 "triton_binary_loads", "triton_jit_launches")

counters: collections.Counter = collections.Counter()
# seconds per compile stage, summed over every compile of the process (benchmarks read it
# without registering a recorder, which would turn the graph cache off)
stage_seconds: collections.Counter = collections.Counter()


def bump(name: str, n: int = 1):
    counters[name] += n


def snapshot() -> dict:
    out = {k: 0 for k in COUNTER_NAMES}
    out.update(counters)
    return out


def stage_totals() -> dict:
    return {k: round(v, 4) for k, v in stage_seconds.items()}


def reset():
    counters.clear()
    stage_seconds.clear()
