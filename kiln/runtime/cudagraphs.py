"""``mode="reduce-overhead"``: a compiled graph recorded into a CUDA graph and replayed.

``CudaGraphRunner`` wraps one compiled graph (one cache entry; with graph breaks, each graph
separately). Its first call runs normally (the warm-up: kernels load, Triton's first launches
happen). The second call records: inputs whose address did not change since the warm-up
(parameters, buffers, anything the caller keeps in place) are recorded *in place*; every other
input gets a static buffer of its own, copied into before each replay. Later calls copy the
moving inputs in (only where the data pointer differs from the static buffer) and replay.

**Outputs without copies, and never overwritten under the caller.** A replay writes its outputs
to the same (static) memory every time, so handing them out as they are would let the next
replay change a result the caller still holds, unlike eager. Cloning each output costs a
device copy per call (GPT-2 small's logits: 7% of its forward; docs/notes/measurements.md). Instead the runner keeps up to two recordings of the graph (slots),
each with its own outputs, and hands out aliases of them. Before a replay it asks, for each
slot, whether anything still refers to that slot's output memory: the storage's use count
(which counts every tensor on it, views and detached aliases included) against its count when
nothing outside the runner held it. It replays a slot that is free; in the usual loop
(``out = f(x)``: the previous result is still held while the next call runs) the two slots
alternate. When both are held (the caller keeps every result) the call runs the compiled
graph without CUDA graphs, which makes fresh outputs. An output that is a view of an input
copied in (a static input buffer) is still cloned: the next copy-in overwrites it.

An in-place input that moves (a parameter replaced) makes the function run without CUDA graphs
from then on (recording again is not done: see ``_replay``).

**Memory pools.** By default each recording has a memory pool of its own. A shared pool lets a
later recording place its outputs in memory an earlier recording uses for intermediates (freed
when that capture ended); replaying the earlier one would then overwrite outputs the caller
holds. So sharing is safe only for recordings whose outputs never leave the pool: those that
hand out clones, made right after their replay on the recording's stream, before any other
replay of the pool can run. ``config.cudagraph_share`` chooses:

- ``"0"``: a private pool per recording, outputs handed out as they are (above);
- ``"auto"`` (default): the first recording is made in a private pool and measured; when its
  intermediates take at least ``SHARE_MIN_SCRATCH`` bytes and its outputs at most
  1/``SHARE_RATIO`` of that, it is recorded again in the device's shared pool, where every
  recording so chosen reuses the same intermediate memory and hands out clones (a device copy
  of small outputs per call instead of one more copy of large intermediates per recording);
- ``"1"``: every recording in the shared pool, outputs cloned.

A shared recording replays only on the stream it was recorded on (replays of one pool must
not overlap); on another stream the call runs without CUDA graphs.

Refused, with the reason logged on ``cudagraphs`` (the graph then runs normally): CPU graphs,
symbolic shapes, graphs that mutate their inputs, graphs that need autograd (training), graphs
that draw random numbers (a replay would repeat them), eager fallbacks, graphs of a single
launch (a replay and its output clones cost more than the launch), and anything that fails to
record (an op that synchronizes with the host, say).
"""
from __future__ import annotations

import torch

from kiln import log
from kiln.autograd.function import CompiledAutograd
from kiln.config import config



# The driver's compiled graph (pipeline.CompiledGraph): the driver sits above the runtime, so
# kiln/__init__.py hands it down.
COMPILED_GRAPH: type = type(None)


def refusal(compiled, graph, dynamic=False) -> str | None:
    """Why compiled cannot be recorded, or None."""
    if isinstance(compiled, CompiledAutograd):
        return "the graph needs autograd (training); reduce-overhead records inference graphs only"
    if getattr(graph, "input_mutations", None):
        return "the graph mutates its inputs"
    if not isinstance(compiled, COMPILED_GRAPH):
        return f"the graph runs as {type(compiled).__name__}, not as generated kernels"
    if compiled.target != "triton" or not torch.cuda.is_available():
        return "the graph runs on the CPU; CUDA graphs need CUDA tensors"
    if dynamic or compiled.size_args:
        return "the graph has symbolic (dynamic) shapes"
    if "torch.randint(" in (compiled.wrapper_source or ""):
        return "the graph draws random numbers (a replay would repeat them)"
    if compiled.kernel_count + compiled.extern_count <= 1:
        # a replay plus the clone of each output costs more host time than the one launch it
        # replaces (measured on the seed example: docs/notes/measurements.md)
        return "the graph is a single launch; a replay and its output copies cost more than the launch"
    return None


def wrap(compiled, graph, name: str, dynamic=False):
    """compiled itself (refused, reason logged) or a CudaGraphRunner around it."""
    why = refusal(compiled, graph, dynamic)
    if why is not None:
        log.log("cudagraphs", "%s: not recorded into a CUDA graph: %s", name, why)
        return compiled
    return CudaGraphRunner(compiled, name)


_use_count = getattr(torch._C, "_storage_Use_Count", None)  # counts tensors on one storage


SHARE_MIN_SCRATCH = 64 << 20  # "auto": intermediates worth sharing (bytes)
SHARE_RATIO = 8               # "auto": outputs at most 1/8 of the intermediates
_shared_pools: dict = {}      # CUDA device index -> the pool shared recordings are made in


def _shared_pool():
    """The id of the device's shared pool. It is held as a ``torch.cuda.MemPool``, which keeps a
    use count on the pool for as long as kiln holds it. A bare ``graph_pool_handle()`` has none
    of its own: once every graph recorded in it was freed, its count fell to 0 while blocks of
    it were still alive, and the next capture into the same id failed the allocator's assert
    ``use_count > 0`` (the H100, torch 2.11: the recording fell back to no CUDA graphs)."""
    dev = torch.cuda.current_device()
    pool = _shared_pools.get(dev)
    if pool is None:
        mem_pool = getattr(torch.cuda, "MemPool", None)
        pool = _shared_pools[dev] = mem_pool() if mem_pool is not None else torch.cuda.graph_pool_handle()
    return getattr(pool, "id", pool)


def _share_choice(scratch: int, out_bytes: int) -> bool:
    """"auto": share a recording whose intermediates are large and outputs small."""
    return scratch >= SHARE_MIN_SCRATCH and out_bytes * SHARE_RATIO <= scratch


class _Slot:
    """One recording: the CUDA graph, its static outputs, how to hand each out (``alias``: the
    runner's own memory, cloned instead when the recording is in the shared pool; ``clone``: a
    view of a static input buffer; ``same``: a view of an input read in place, which replays
    never write), and the storages whose use counts say whether the caller still holds any
    output."""
    __slots__ = ("graph", "outputs", "how", "storages", "baseline", "shared", "stream", "pool_bytes")

    def __init__(self, graph, outputs, static_inputs, moving, shared=False, pool_bytes=0):
        self.graph, self.outputs = graph, outputs
        self.shared, self.pool_bytes = shared, pool_bytes
        self.stream = torch.cuda.current_stream()
        if shared:  # every output in the pool is cloned: no use counts to watch
            self.how = ["clone" if self._inside(o, static_inputs, moving) else "same"
                        if isinstance(o, torch.Tensor) else None for o in outputs]
            self.storages, self.baseline = (), ()
            return
        inputs_at = {}
        for i, t in enumerate(static_inputs):
            if isinstance(t, torch.Tensor):
                inputs_at[t.untyped_storage().data_ptr()] = i in moving
        self.how, storages = [], {}
        for o in outputs:
            if not isinstance(o, torch.Tensor):
                self.how.append(None)
                continue
            ptr = o.untyped_storage().data_ptr()
            if ptr in inputs_at:
                self.how.append("clone" if inputs_at[ptr] else "same")
            else:
                self.how.append("alias")
                storages.setdefault(ptr, o.untyped_storage())
        self.storages = tuple(storages.values())
        self.baseline = tuple(_use_count(st._cdata) for st in self.storages) if _use_count else None

    @staticmethod
    def _inside(o, static_inputs, moving) -> bool:
        """A shared recording's output that must be cloned: anything but a view of an input
        read in place."""
        if not isinstance(o, torch.Tensor):
            return False
        ptr = o.untyped_storage().data_ptr()
        return not any(isinstance(t, torch.Tensor) and i not in moving and t.untyped_storage().data_ptr() == ptr
                       for i, t in enumerate(static_inputs))

    def free(self) -> bool:
        """Nothing outside the runner refers to this slot's output memory."""
        if self.baseline is None:
            return False
        return all(_use_count(st._cdata) == b for st, b in zip(self.storages, self.baseline))

    def hand_out(self):
        out = []
        for o, how in zip(self.outputs, self.how):
            if how in ("alias", "same"):
                out.append(o.detach())   # a new tensor on the same memory: counted as held
            elif how == "clone":
                out.append(o.clone())
            else:
                out.append(o)
        return tuple(out)


MAX_SLOTS = 2


class CudaGraphRunner:
    def __init__(self, compiled, name):
        self.compiled = compiled
        self.name = name
        self.calls = 0
        self.recordings = 0
        self.refused = None
        self.graph = None      # the first slot's graph (None: not recorded, or refused)
        self.slots: list = []
        self.next_slot = 0
        self.held_runs = 0     # calls that ran without CUDA graphs: every slot's outputs held
        self.warm_ptrs = None
        self.static_inputs = None
        self.moving = ()
        self.in_place = ()
        # for explain / the debug dump
        self.kernel_count = getattr(compiled, "kernel_count", 0)
        self.extern_count = getattr(compiled, "extern_count", 0)
        self.wrapper_source = getattr(compiled, "wrapper_source", None)

    def _refuse(self, why):
        self.refused = why
        self.graph = None
        self.slots = []
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
            self._static_inputs(inputs, moving)
            self.slots.append(self._record())
        except Exception as e:  # noqa: BLE001 - anything that cannot be captured runs normally
            self._refuse(f"recording failed: {type(e).__name__}: {e}")
            return self.compiled(*inputs)
        self.graph = self.slots[0].graph
        return self._replay(inputs)

    def _static_inputs(self, inputs, moving: set):
        """Inputs in ``moving`` get static buffers; the others are read where they live."""
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

    def _record(self) -> _Slot:
        """One more recording of the graph over the static inputs, with outputs of its own (in a
        private pool, or the shared one: see the module doc)."""
        self.recordings += 1
        static = self.static_inputs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # one run off the capture, as torch recommends
            self.compiled(*static)
        torch.cuda.current_stream().wait_stream(stream)
        share = config.cudagraph_share if not self.slots else "0"  # a shared slot never needs a second
        if share == "1":
            slot = self._capture(static, shared=True)
        else:
            slot = self._capture(static, shared=False)
            if share == "auto":
                out_bytes = sum(st.nbytes() for st in slot.storages)
                scratch = max(0, slot.pool_bytes - out_bytes)
                if _share_choice(scratch, out_bytes):
                    log.log("cudagraphs", "%s: intermediates %.1f MB, outputs %.1f MB: recorded again in the "
                            "shared pool, outputs cloned per call", self.name, scratch / 2**20, out_bytes / 2**20)
                    del slot
                    slot = self._capture(static, shared=True)
        log.log("cudagraphs", "%s: recorded a CUDA graph, slot %d (%d inputs copied in, %d in place)%s",
                self.name, len(self.slots), len(self.moving), len(self.in_place),
                ", in the shared pool" if slot.shared else "")
        return slot

    def _capture(self, static, shared: bool) -> _Slot:
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph empties the allocator's cache before capturing; emptying it here first
        # makes the reserved memory's growth the memory the capture took (the shared pool's and
        # live private pools' blocks are never released by it)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        with torch.cuda.graph(graph, pool=_shared_pool() if shared else None):
            outs = self.compiled(*static)
        return _Slot(graph, tuple(outs), static, set(self.moving), shared=shared,
                     pool_bytes=max(0, torch.cuda.memory_reserved() - before))

    def _pick_slot(self):
        """A slot whose outputs nothing holds, starting with the one after the last replayed;
        a second recording when the only one is held; None when every slot is held."""
        n = len(self.slots)
        for k in range(n):
            slot = self.slots[(self.next_slot + k) % n]
            if slot.free():
                self.next_slot = (self.next_slot + k + 1) % n
                return slot
        if n < MAX_SLOTS and self.slots[0].baseline is not None:
            slot = self._record()
            self.slots.append(slot)
            self.next_slot = 0
            return slot
        return None

    def _replay(self, inputs):
        static = self.static_inputs
        for i, ptr in self.in_place:
            if inputs[i].data_ptr() != ptr:
                # a parameter was replaced. Recording again was tried and, on a GPU, a later
                # capture could leave torch's CUDA generator in capture mode; until that is
                # understood the function runs without CUDA graphs from here on
                self._refuse("an input read in place moved (a parameter was replaced)")
                return self.compiled(*inputs)
        if self.slots[0].baseline is None:  # no use counts in this torch: clone every output
            slot = self.slots[0]
            self._copy_in(inputs, static)
            slot.graph.replay()
            return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in slot.outputs)
        self._copy_in(inputs, static)
        try:
            slot = self._pick_slot()
        except Exception as e:  # noqa: BLE001 - a second recording that fails: run normally
            self._refuse(f"recording failed: {type(e).__name__}: {e}")
            return self.compiled(*inputs)
        if slot is None:
            # the caller still holds the outputs of every recording: fresh outputs this time
            self.held_runs += 1
            if self.held_runs == 1:
                log.log("cudagraphs", "%s: the outputs of both recordings are still held; this call (and "
                        "any like it) runs without CUDA graphs", self.name)
            return self.compiled(*inputs)
        if slot.shared and torch.cuda.current_stream() != slot.stream:
            return self.compiled(*inputs)  # replays of the shared pool must not overlap
        slot.graph.replay()
        return slot.hand_out()

    def _copy_in(self, inputs, static):
        for i in self.moving:
            src, dst = inputs[i], static[i]
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)
