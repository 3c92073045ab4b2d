"""Process-wide counters, read with ``kiln.stats()``."""
from __future__ import annotations

import collections

COUNTER_NAMES = ("frames_compiled", "recompiles", "graph_breaks", "kernels_generated",
                 "cache_hits", "disk_cache_hits", "fallbacks", "eager_runs", "graphs_compiled",
                 "kernel_builds", "graph_cache_hits", "partition_cache_hits")

counters: collections.Counter = collections.Counter()


def bump(name: str, n: int = 1):
    counters[name] += n


def snapshot() -> dict:
    out = {k: 0 for k in COUNTER_NAMES}
    out.update(counters)
    return out


def reset():
    counters.clear()
