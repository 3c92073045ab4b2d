"""``mode="reduce-overhead"``: a compiled graph recorded into a CUDA graph and replayed.

``CudaGraphRunner`` wraps one compiled graph (one cache entry; with graph breaks, each graph
separately). Its first call runs normally (the warm-up: kernels load, Triton's first launches
happen). The second call records: inputs whose address did not change since the warm-up
(parameters, buffers, anything the caller keeps in place) are recorded *in place*; every other
input gets a static buffer of its own, copied into before each replay. Later calls copy the
moving inputs in (only where the data pointer differs from the static buffer), replay, and
return **clones** of the graph's outputs: a result never changes under the caller when the
function runs again, as in eager. (The copy costs one device copy per output; returning the
static outputs instead would be cheaper but unlike eager.) An in-place input that moves (a
parameter replaced) makes the function run without CUDA graphs from then on (recording again
is not done: see ``_replay``).

All graphs recorded for one compiled function share one memory pool: they replay one after the
other on the capturing stream, and outputs are cloned before the next replay, so no recorded
graph's live memory is handed to another.

Refused, with the reason logged on ``cudagraphs`` (the graph then runs normally): CPU graphs,
symbolic shapes, graphs that mutate their inputs, graphs that need autograd (training), graphs
that draw random numbers (a replay would repeat them), eager fallbacks, graphs of a single
launch (a replay and its output clones cost more than the launch), and anything that fails to
record (an op that synchronizes with the host, say).
"""
from __future__ import annotations

import torch

from kiln import log



def refusal(compiled, graph, dynamic=False) -> str | None:
    """Why compiled cannot be recorded, or None."""
    from kiln.autograd.function import CompiledAutograd
    from kiln.pipeline import CompiledGraph
    if isinstance(compiled, CompiledAutograd):
        return "the graph needs autograd (training); reduce-overhead records inference graphs only"
    if getattr(graph, "input_mutations", None):
        return "the graph mutates its inputs"
    if not isinstance(compiled, CompiledGraph):
        return f"the graph runs as {type(compiled).__name__}, not as generated kernels"
    if compiled.target != "triton" or not torch.cuda.is_available():
        return "the graph runs on the CPU; CUDA graphs need CUDA tensors"
    if dynamic or compiled.size_args:
        return "the graph has symbolic (dynamic) shapes"
    if "torch.randint(" in (compiled.wrapper_source or ""):
        return "the graph draws random numbers (a replay would repeat them)"
    if compiled.kernel_count + compiled.extern_count <= 1:
        # a replay plus the clone of each output costs more host time than the one launch it
        # replaces (H200: 18.1 us a call against 15.2 us, the seed example at 1024x1024)
        return "the graph is a single launch; a replay and its output copies cost more than the launch"
    return None


def wrap(compiled, graph, name: str, pool_owner, dynamic=False):
    """compiled itself (refused, reason logged) or a CudaGraphRunner around it."""
    why = refusal(compiled, graph, dynamic)
    if why is not None:
        log.log("cudagraphs", "%s: not recorded into a CUDA graph: %s", name, why)
        return compiled
    return CudaGraphRunner(compiled, name, pool_owner)


class CudaGraphRunner:
    def __init__(self, compiled, name, pool_owner):
        self.compiled = compiled
        self.name = name
        self.pool_owner = pool_owner  # holds the memory pool shared by its graphs
        self.calls = 0
        self.recordings = 0
        self.refused = None
        self.graph = None
        self.warm_ptrs = None
        # for explain / the debug dump
        self.kernel_count = getattr(compiled, "kernel_count", 0)
        self.extern_count = getattr(compiled, "extern_count", 0)
        self.wrapper_source = getattr(compiled, "wrapper_source", None)

    def _refuse(self, why):
        self.refused = why
        self.graph = None
        log.log("cudagraphs", "%s: runs without CUDA graphs from now on: %s", self.name, why)

    def __call__(self, *inputs):
        if self.refused is not None:
            return self.compiled(*inputs)
        if self.graph is not None:
            return self._replay(inputs)
        self.calls += 1
        if self.calls == 1:  # warm-up
            self.warm_ptrs = [t.data_ptr() if isinstance(t, torch.Tensor) else None for t in inputs]
            return self.compiled(*inputs)
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.device.type != "cuda":
                self._refuse(f"an input lives on {t.device}")
                return self.compiled(*inputs)
        moving = {i for i, (t, ptr) in enumerate(zip(inputs, self.warm_ptrs))
                  if isinstance(t, torch.Tensor) and t.data_ptr() != ptr}
        try:
            self._record(inputs, moving)
        except Exception as e:  # noqa: BLE001 - anything that cannot be captured runs normally
            self._refuse(f"recording failed: {type(e).__name__}: {e}")
            return self.compiled(*inputs)
        return self._replay(inputs)

    def _record(self, inputs, moving: set):
        """Inputs in ``moving`` get static buffers; the others are read where they live."""
        self.recordings += 1
        static = []
        for i, t in enumerate(inputs):
            if i in moving:
                buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                buf.copy_(t)
                static.append(buf)
            else:
                static.append(t)
        self.static_inputs = static
        self.moving = tuple(sorted(moving))
        self.in_place = tuple((i, t.data_ptr()) for i, t in enumerate(static)
                              if isinstance(t, torch.Tensor) and i not in moving)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # one run off the capture, as torch recommends
            self.compiled(*static)
        torch.cuda.current_stream().wait_stream(stream)
        pool = getattr(self.pool_owner, "_kiln_graph_pool", None)
        if pool is None:
            pool = torch.cuda.graph_pool_handle()
            setattr(self.pool_owner, "_kiln_graph_pool", pool)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outs = self.compiled(*static)
        self.static_outputs = outs
        self.graph = graph
        log.log("cudagraphs", "%s: recorded a CUDA graph (%d inputs copied in, %d in place)", self.name,
                len(moving), len(self.in_place))

    def _replay(self, inputs):
        static = self.static_inputs
        for i, ptr in self.in_place:
            if inputs[i].data_ptr() != ptr:
                # a parameter was replaced. Recording again was tried and, on the H200, a later
                # capture could leave torch's CUDA generator in capture mode; until that is
                # understood the function runs without CUDA graphs from here on
                self._refuse("an input read in place moved (a parameter was replaced)")
                return self.compiled(*inputs)
        for i in self.moving:
            src, dst = inputs[i], static[i]
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)
        self.graph.replay()
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_outputs)
