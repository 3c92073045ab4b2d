"""kiln: a compiler for PyTorch programs.

    model = kiln.compile(model)
"""
from kiln import counters as _counters
from kiln._version import __version__
from kiln.api import (CompiledFunction, CompiledModule, GraphBreakError, compile, disable,
                      graph_break, is_compiling, mark_dynamic, reset)
from kiln.config import config
from kiln.observe.explain import ExplainOutput, explain

# The few objects a lower layer needs from a higher one are handed down here, where every
# layer is loaded (docs/architecture.md, "Layers"). kiln.breaks and kiln.distributed fill the
# api's hooks as they load (api.AT_BREAK, api.MODEL_WRAPPERS), and kiln.observe (loaded by
# kiln.observe.explain above) subscribes to the driver's events: imported here so that every
# way into kiln (kiln.compile, kiln.api, the interop backend) has them.
from kiln import api as _api, pipeline as _pipeline  # noqa: E402
from kiln import breaks as _breaks, distributed as _distributed  # noqa: E402, F401
from kiln.capture import module_call as _module_call  # noqa: E402
from kiln.runtime import cudagraphs as _cudagraphs  # noqa: E402

_module_call.COMPILED_MODULE = _api.CompiledModule
_cudagraphs.COMPILED_GRAPH = _pipeline.CompiledGraph


def stats() -> dict[str, int]:
    """Counters: frames_compiled, recompiles, graph_breaks, kernels_generated, cache_hits,
    disk_cache_hits, fallbacks, ..."""
    return _counters.snapshot()


__all__ = ["__version__", "compile", "explain", "reset", "stats", "config", "disable", "graph_break",
           "is_compiling", "mark_dynamic", "CompiledFunction", "CompiledModule",
           "ExplainOutput", "GraphBreakError"]
