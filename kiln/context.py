"""The compile context: what one compile did, stage by stage.

Every pass runs through ``run_pass``, which records the pass name, its time and its output
IR. ``kiln.explain``, ``KILN_DEBUG`` dumps and the HTML report all read this record.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import time

from kiln import log
from kiln.config import config
from kiln.counters import stage_seconds

_ids = itertools.count()
_local = threading.local()
# Lists that get the context of every compile that starts (kiln.explain, the demo, tests):
# the api appends, the graph cache stays off while one listens (they read every stage's output)
RECORDERS: list[list] = []

# Stage names in pipeline order; compile_times is reported in this order.
STAGES = ("capture", "meta", "autograd", "decomp", "lowering", "scheduling", "codegen", "build")


class CompileContext:
    def __init__(self, name: str):
        self.compile_id = next(_ids)
        self.name = name
        self.artifacts: list[tuple[str, str, object]] = []  # (stage, pass name, IR)
        self.stage_times: dict[str, float] = {}
        self.pass_times: list[tuple[str, str, float]] = []
        self.kernel_count = 0
        self.extern_calls = 0
        self.kernels: list = []
        self.guards: list[str] = []
        self.graph_breaks: list = []
        self.events: list[dict] = []
        # called (once) when this compile's next build stage starts (autograd/speculate.py)
        self.before_build: list = []
        # the strides of the last lowered graph's tensor outputs (None for other outputs): a
        # training forward's saved tensors, for the backward's speculation
        self.output_strides: list | None = None

    def record(self, stage: str, name: str, ir):
        self.artifacts.append((stage, name, ir))

    def artifact(self, name: str):
        for _, n, ir in reversed(self.artifacts):
            if n == name:
                return ir
        raise KeyError(f"no artifact named {name!r}; have {[n for _, n, _ in self.artifacts]}")

    def add_time(self, stage: str, seconds: float):
        self.stage_times[stage] = self.stage_times.get(stage, 0.0) + seconds
        stage_seconds[stage] += seconds


def current() -> CompileContext | None:
    return getattr(_local, "ctx", None)


def _compile_id():
    ctx = getattr(_local, "ctx", None)
    return None if ctx is None else ctx.compile_id


log.compile_id = _compile_id  # each log line names the compile that logged it


@contextlib.contextmanager
def compiling(name: str):
    prev = current()
    ctx = CompileContext(name)
    _local.ctx = ctx
    gc_pause()
    try:
        yield ctx
    finally:
        gc_resume()
        _local.ctx = prev


# The cyclic GC during compiles. A compile allocates millions of short-lived objects (graph
# nodes, sympy expressions, IR), which trigger full collections, and each one walks the whole
# heap: torch's and the program's. ``gc.freeze()`` at the first compile's start moves that heap
# into the permanent generation, where collections skip it; ``gc.unfreeze()`` when the last
# compile (of any thread) ends moves it back into the oldest generation, so nothing is lost and
# the program's own garbage is collected as before. A process that froze its heap itself (a
# server before forking workers) is left alone: unfreezing would undo its freeze.
#
# Some interpreters start with a few objects frozen already (Ubuntu's CPython 3.12 build: 375,
# before any import). That is not a heap freeze, so the count seen when kiln is imported is the
# baseline when it is small; a count above it means the program froze its heap after importing
# kiln, and a large baseline that it froze before. Our unfreeze also returns those few startup
# objects to the oldest generation, where collections visit them; nothing else changes.
_gc_lock = threading.Lock()
_gc_state = {"depth": 0, "undo": None}
_STARTUP_FROZEN_MAX = 10_000


def _startup_frozen() -> int:
    return gc.get_freeze_count()


STARTUP_FROZEN = _startup_frozen()


def program_froze_heap() -> bool:
    """True when the process froze its own heap (``gc.freeze()``) since or before kiln's import."""
    if STARTUP_FROZEN > _STARTUP_FROZEN_MAX:
        return True
    return gc.get_freeze_count() > STARTUP_FROZEN


def gc_pause():
    with _gc_lock:
        _gc_state["depth"] += 1
        if _gc_state["depth"] != 1:
            return
        mode = config.compile_gc
        if mode == "freeze" and gc.isenabled() and not program_froze_heap():
            gc.freeze()
            _gc_state["undo"] = gc.unfreeze
        elif mode == "off" and gc.isenabled():
            gc.disable()
            _gc_state["undo"] = gc.enable


def gc_resume():
    with _gc_lock:
        _gc_state["depth"] -= 1
        if _gc_state["depth"] == 0 and _gc_state["undo"] is not None:
            undo, _gc_state["undo"] = _gc_state["undo"], None
            undo()


def run_pass(stage: str, fn, ir, *args, name: str | None = None, **kwargs):
    """Run one named pass IR -> IR, timing it and keeping its output for later inspection."""
    name = name or fn.__name__
    t0 = time.perf_counter()
    out = fn(ir, *args, **kwargs)
    dt = time.perf_counter() - t0
    ctx = current()
    if ctx is not None:
        ctx.add_time(stage, dt)
        ctx.pass_times.append((stage, name, dt))
        ctx.record(stage, name, out)
    log.pass_done(stage, name, dt, out)
    return out


@contextlib.contextmanager
def timed(stage: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        ctx = current()
        if ctx is not None:
            ctx.add_time(stage, time.perf_counter() - t0)
