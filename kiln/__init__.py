"""kiln: a compiler for PyTorch programs.

    model = kiln.compile(model)
"""
from kiln import counters as _counters
from kiln._version import __version__
from kiln.api import (CompiledFunction, CompiledModule, GraphBreakError, compile, disable,
                      graph_break, is_compiling, mark_dynamic, reset)
from kiln.config import config
from kiln.observe.explain import ExplainOutput, explain


def stats() -> dict[str, int]:
    """Counters: frames_compiled, recompiles, graph_breaks, kernels_generated, cache_hits,
    disk_cache_hits, fallbacks, ..."""
    return _counters.snapshot()


__all__ = ["__version__", "compile", "explain", "reset", "stats", "config", "disable", "graph_break",
           "is_compiling", "mark_dynamic", "CompiledFunction", "CompiledModule",
           "ExplainOutput", "GraphBreakError"]
