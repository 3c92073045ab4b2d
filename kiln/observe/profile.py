"""Run a compiled program under observation and write ``profile.json`` next to its debug dump.

What is measured, and how:

- **Kernel times.** While observing, every graph kiln builds has each kernel in its wrapper's
  namespace replaced by a timing shim (the wrapper source is unchanged; it looks kernels up by
  name). Each call is wrapped in ``torch.profiler.record_function`` named
  ``kiln kernel <compile folder>/<kernel>``, so it shows on the profiler timeline, as does each
  graph call (``kiln graph <compile folder>``).

  * A C++ kernel is a synchronous ctypes call: the shim times it with ``time.perf_counter``
    (this includes the ctypes call overhead, about a microsecond).
  * A Triton kernel on CUDA is timed on the device, never host-side: its time is the duration
    of the GPU kernel the profiler's CUDA activity recorded for that launch (device kernels are
    matched to kiln's ranges by name, in launch order). Where the profiler has no device
    activity for every call, the times come from an instrumented run instead: the shim puts a
    pair of CUDA events around each launch, after a short ``torch.cuda._sleep`` that keeps the
    GPU busy while the host enqueues the start event, the launch and the end event, so the
    events measure the kernel's device time, not the host's launch latency.
  * Under the Triton interpreter (no GPU) the kernel runs on the host: ``time.perf_counter``.
- **Timeline.** ``torch.profiler`` (CPU activities, plus CUDA when available) records the run;
  the report draws kiln's ranges, the torch ops run outside kernels (eager code, library calls)
  and device kernels.
- **Host synchronizations.** A ``torch.overrides.TorchFunctionMode`` notes every call that
  makes the host read a tensor's value (``item``, ``bool``/``if``, ``float``/``int``,
  ``tolist``, printing) and the user's file:line that made it.

``profile(fn, *args)`` runs ``fn`` once to compile (not timed), then ``runs`` times under the
profiler. ``profile_script(path)`` runs a script once under the profiler (its compiles included).
Both return the run folder, which ``python -m kiln report`` turns into a page.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import runpy
import sys
import time

import torch
from torch.overrides import TorchFunctionMode

from kiln import api, context, pipeline
from kiln.config import config
from kiln.observe import debug

SYNC_CALLS = {"item": "Tensor.item()", "__bool__": "truth value of a tensor (if/while/and/or)",
              "__float__": "float(tensor)", "__int__": "int(tensor)", "__index__": "tensor as index",
              "tolist": "Tensor.tolist()", "numpy": "Tensor.numpy()", "__repr__": "printing a tensor",
              "__str__": "printing a tensor", "__format__": "formatting a tensor"}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.dirname(contextlib.__file__) + os.sep


def _user_frame():
    """The innermost frame outside torch and the standard library, or None when that frame is
    kiln's own code (its compiler and generated wrappers do not count as the program's syncs)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or
                (name.startswith(_STDLIB_DIR) and "site-packages" not in name)):
            break
        f = f.f_back
    if f is None or f.f_code.co_filename.startswith((_KILN_DIR, "<kiln")):
        return None
    return f


class _SyncRecorder(TorchFunctionMode):
    """Counts calls that make the host read a tensor's value, by the user's file:line.
    (torch disables the mode inside its own handler, so a print's inner item() calls are not
    counted twice.)"""

    def __init__(self):
        super().__init__()
        self.seen: dict = collections.OrderedDict()  # (file, line, call) -> count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNC_CALLS:
            f = _user_frame()
            if f is not None:
                key = (f.f_code.co_filename, f.f_lineno, name)
                self.seen[key] = self.seen.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


# cycles the GPU spins before each instrumented launch: ~0.1-0.5 ms on current GPUs, longer
# than a Triton launch takes on the host, so the start event waits on the device, not the host
SLEEP_CYCLES = 1_000_000


class _TimedKernel:
    """Stands in for one kernel in a wrapper's namespace; times each launch, however the wrapper
    spells it: ``k(...)`` (C++ through ctypes, a Triton launch line), ``k[grid](...)`` or
    ``k.run(...)`` (Triton)."""
    kiln_records_range = True  # runtime/profiler_regions.py: no second range around it

    def __init__(self, fn, label: str, times: list, obs: "Observer", on_cuda: bool, key=None):
        self.fn, self.label, self.times, self.obs = fn, label, times, obs
        self.on_cuda, self.key = on_cuda, key

    def _timed(self, launch):
        def call(*args, **kwargs):
            if self.key is not None and self.key not in self.obs.nbytes:
                self.obs.nbytes[self.key] = sum(a.numel() * a.element_size() for a in args
                                                if isinstance(a, torch.Tensor))
            with torch.profiler.record_function(self.label):
                if self.on_cuda:  # asynchronous: timed on the device (see the module docstring)
                    if not self.obs.device_events:
                        return launch(*args, **kwargs)
                    torch.cuda._sleep(SLEEP_CYCLES)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = launch(*args, **kwargs)
                    end.record()
                    self.obs.pending.append((self.times, start, end))
                    return out
                t0 = time.perf_counter()  # synchronous (C++ kernels, the Triton interpreter)
                out = launch(*args, **kwargs)
                self.times.append(time.perf_counter() - t0)
                return out
        return call

    def __call__(self, *args, **kwargs):
        return self._timed(self.fn)(*args, **kwargs)

    def __getitem__(self, grid):
        return self._timed(self.fn[grid])

    def __getattr__(self, name):
        value = getattr(self.fn, name)
        return self._timed(value) if callable(value) else value


class Observer:
    """Times every kernel of every graph built while active (see the module docstring)."""

    def __init__(self):
        self.times: dict = collections.defaultdict(list)  # (folder, kernel) -> seconds per call
        self.pending: list = []
        self.syncs = _SyncRecorder()
        self._build = None
        self.device_events = False  # CUDA: time each launch with events (the instrumented run)
        self.device_names: dict = {}  # (folder, kernel) -> the device kernel's name, where it differs
        self.nbytes: dict = {}  # (folder, kernel) -> bytes of its tensor arguments (one launch)
        self.on_cuda = False

    def _timed_build(self, wrapper, generated, target, *rest, **kwargs):
        call = self._build(wrapper, generated, target, *rest, **kwargs)
        ctx = context.current()
        folder = debug.folder_name(ctx) if ctx is not None else "unknown"
        namespace = call.__globals__
        on_cuda = target == "triton" and torch.cuda.is_available()
        self.on_cuda = self.on_cuda or on_cuda
        for name in (k.name for k in generated.values()):
            # a kernel sharing another's binary (runtime/builder.representatives) runs on the
            # device under that kernel's name
            inner = getattr(namespace[name], "fn", namespace[name])
            binary = getattr(inner, "__name__", name)
            if binary != name and isinstance(binary, str):
                self.device_names[(folder, name)] = binary
            # a launch line built beside the wrapper (codegen/wrapper._triton_call) is what
            # the wrapper calls; it holds the kernel itself, so it is timed in its own right
            for slot in (name, f"{name}_launch"):
                if slot in namespace:
                    namespace[slot] = _TimedKernel(namespace[slot], f"kiln kernel {folder}/{name}",
                                                   self.times[(folder, name)], self, on_cuda, (folder, name))
        label = f"kiln graph {folder}"

        def timed_call(*inputs):
            with torch.profiler.record_function(label):
                return call(*inputs)
        return timed_call

    def __enter__(self):
        self._build = pipeline.build

        def build(*args, **kwargs):  # same name: run_pass records passes by name
            return self._timed_build(*args, **kwargs)
        pipeline.build = build
        self.syncs.__enter__()
        return self

    def __exit__(self, *exc):
        self.syncs.__exit__(*exc)
        pipeline.build = self._build

    def resolve(self):
        if self.pending:
            torch.cuda.synchronize()
            for times, start, end in self.pending:
                times.append(start.elapsed_time(end) / 1e3)
            self.pending.clear()

    def reset_times(self):
        self.resolve()
        for v in self.times.values():
            v.clear()
        self.syncs.seen.clear()


def _is_device(e) -> bool:
    return e.device_type != torch.autograd.DeviceType.CPU


def _spin(name: str) -> bool:
    """torch.cuda._sleep's kernel (the instrumented run's padding), not the program's work."""
    return "spin_kernel" in name or "sleep" in name.lower()


def match_device_kernels(events, device_names=None) -> dict:
    """(folder, kernel) -> [(start_us, dur_us)] per call: each ``kiln kernel F/K`` range's GPU
    kernel is the first device event named K (or ``device_names[(F, K)]``, the binary K shares)
    that starts after the range began and that no earlier range took (launches on one stream run in launch order). Unmatched calls are left
    out, so a list shorter than the call count means the profiler missed some."""
    ranges = sorted((e for e in events if e.name.startswith("kiln kernel ") and not _is_device(e)),
                    key=lambda e: e.time_range.start)
    device: dict = collections.defaultdict(list)  # kernel name -> device events, by start
    for e in events:
        if _is_device(e) and not _spin(e.name):
            device[e.name].append(e)
    for evs in device.values():
        evs.sort(key=lambda e: e.time_range.start)
    taken = collections.defaultdict(int)  # kernel name -> index of the first unclaimed event
    out = collections.defaultdict(list)
    for r in ranges:
        folder, kernel = r.name.split(" ", 2)[2].split("/", 1)
        binary = (device_names or {}).get((folder, kernel), kernel)
        evs, i = device.get(binary, []), taken[binary]
        while i < len(evs) and evs[i].time_range.start < r.time_range.start:
            i += 1
        if i < len(evs):
            e = evs[i]
            out[(folder, kernel)].append((e.time_range.start, e.time_range.end - e.time_range.start))
            i += 1
        taken[binary] = i
    return out


def _timeline(prof, limit=4000, matched=None) -> list:
    """kiln ranges, top-level torch ops and device kernels, in microseconds from the first.
    Device kernels matched to a kiln kernel are named ``kiln device <folder>/<kernel>``."""
    out = []
    labels = {}
    for (folder, kernel), calls in (matched or {}).items():
        for start, dur in calls:
            labels[(kernel, start)] = f"kiln device {folder}/{kernel}"
    for e in prof.events():
        name = e.name
        if _is_device(e):
            if _spin(name):
                continue
            lane = "device"
            name = labels.get((name, e.time_range.start), name)
        elif name.startswith("kiln: "):
            lane = "call"  # a compiled call's region (runtime/profiler_regions.py)
        elif name.startswith("kiln kernel: "):
            continue  # profiler_regions' kernel range: the Observer's own range times it
        elif name.startswith("kiln "):
            lane = name.split(" ")[1]  # run | graph | kernel
        elif name.startswith("aten::"):
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith(("kiln ", "aten::")):
                parent = parent.cpu_parent
            if parent is not None and not parent.name.startswith(("kiln run", "kiln graph")):
                continue  # inside another op or a kiln kernel: shown by its parent
            lane = "sync" if name in ("aten::_local_scalar_dense", "aten::is_nonzero") else "torch op"
        else:
            continue
        out.append({"name": name, "lane": lane, "start_us": e.time_range.start,
                    "dur_us": e.time_range.end - e.time_range.start})
    if out:
        t0 = min(ev["start_us"] for ev in out)
        for ev in out:
            ev["start_us"] -= t0
    out.sort(key=lambda ev: ev["start_us"])
    return out[:limit]


def kernel_times(obs: Observer, matched: dict, calls: dict) -> list:
    """One record per kernel: its calls and times (s -> us), and where the times came from."""
    obs.resolve()
    rows = []
    for key in sorted(set(obs.times) | set(matched)):
        folder, name = key
        device = [d / 1e6 for _, d in matched.get(key, ())]
        if obs.on_cuda and device and len(device) >= calls.get(key, len(device)):
            ts, source = device, "device (profiler CUDA activity)"
        elif obs.on_cuda and obs.times.get(key):
            ts, source = obs.times[key], "device (CUDA events, GPU kept busy before each launch)"
        elif obs.times.get(key):
            ts, source = obs.times[key], "host (time.perf_counter around the call)"
        else:
            continue
        median = sorted(ts)[len(ts) // 2]
        row = {"folder": folder, "kernel": name, "calls": len(ts), "total_us": sum(ts) * 1e6,
               "mean_us": sum(ts) / len(ts) * 1e6, "median_us": median * 1e6,
               "min_us": min(ts) * 1e6, "source": source}
        nbytes = obs.nbytes.get(key)
        if nbytes:  # each tensor argument read or written once: a floor on the traffic
            row["bytes"] = nbytes
            row["gb_per_s"] = nbytes / median / 1e9 if median > 0 else None
        rows.append(row)
    return rows


def _range_counts(prof) -> dict:
    out = collections.Counter()
    for e in prof.events():
        if e.name.startswith("kiln kernel ") and not _is_device(e):
            folder, kernel = e.name.split(" ", 2)[2].split("/", 1)
            out[(folder, kernel)] += 1
    return out


def _write(run: str, obs: Observer, prof, what: str, runs: int) -> str:
    events = list(prof.events())
    matched = match_device_kernels(events, obs.device_names) if obs.on_cuda else {}
    kernels = kernel_times(obs, matched, _range_counts(prof))
    syncs = [{"filename": f, "lineno": ln, "call": c, "what": SYNC_CALLS[c], "count": n}
             for (f, ln, c), n in obs.syncs.seen.items()]
    data = {"program": what, "runs": runs, "device": "cuda" if torch.cuda.is_available() else "cpu",
            "timing": "C++ kernels: time.perf_counter around the ctypes call; Triton kernels on "
                      "CUDA: device time (the profiler's CUDA activity, or CUDA events with the "
                      "GPU kept busy before each launch, so launch latency is not counted)",
            "kernels": kernels, "syncs": syncs, "timeline": _timeline(prof, matched=matched)}
    with open(os.path.join(run, "profile.json"), "w") as f:
        json.dump(data, f, indent=1)
    return run


def _activities():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def profile(fn, *args, runs: int = 5, **kwargs) -> str:
    """Compile and run ``fn(*args, **kwargs)`` (a kiln-compiled function, or a plain one that
    calls some), then run it ``runs`` times under the profiler (and, on CUDA, ``runs`` more
    times with each kernel launch timed by CUDA events: the instrumented run). Clears kiln's
    in-memory caches first (``kiln.reset()``; the disk cache stays) so every graph is
    compiled, and dumped, under observation. Returns the run folder holding the dump and
    ``profile.json``."""
    api.reset()
    with config.patch(debug=True):
        run = debug.new_run()
        with Observer() as obs:
            fn(*args, **kwargs)  # compile (not timed)
            obs.reset_times()
            with torch.profiler.profile(activities=_activities()) as prof:
                for i in range(runs):
                    with torch.profiler.record_function(f"kiln run {i}"):
                        fn(*args, **kwargs)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            if obs.on_cuda:  # the instrumented run: device times from CUDA events
                obs.device_events = True
                seen = dict(obs.syncs.seen)  # its syncs repeat the profiled runs': not counted
                for _ in range(runs):
                    fn(*args, **kwargs)
                obs.device_events = False
                obs.syncs.seen.clear()
                obs.syncs.seen.update(seen)
        try:
            return _write(run, obs, prof, getattr(fn, "__qualname__", repr(fn)), runs)
        finally:
            debug.end_run()


def profile_script(path: str, argv=()) -> str:
    """Run a script once under the profiler with KILN_DEBUG on; returns the run folder. On CUDA
    the one run is also the instrumented one (CUDA events around each launch; the padding
    kernels they need are left off the timeline)."""
    old_argv = sys.argv
    sys.argv = [path, *argv]
    with config.patch(debug=True):
        run = debug.new_run()
        try:
            with Observer() as obs, torch.profiler.profile(activities=_activities()) as prof:
                obs.device_events = torch.cuda.is_available()
                with torch.profiler.record_function("kiln run 0"):
                    try:
                        runpy.run_path(path, run_name="__main__")
                    except SystemExit:
                        pass
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
        finally:
            sys.argv = old_argv
        try:
            return _write(run, obs, prof, path, 1)
        finally:
            debug.end_run()
