"""Steady-state timing on CPU (perf_counter) and CUDA (events), and cold first-call timing.

Method (see the device notes in METHOD.md): warm up, calibrate how many calls make one sample
long enough to dwarf the clock's resolution, take many samples, report the median. Inputs rotate
among several sets so that small cases are not timed out of a warm cache. The implementations
of one case (eager, torch.compile, kiln) take their samples in turn (``measure_many``).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence

import torch


@dataclasses.dataclass
class TimingPlan:
    warmup_calls: int          # at least this many calls before timing ...
    warmup_s: float            # ... and at least this much time
    sample_s: float            # calls per sample are chosen so one sample lasts about this long
    samples: int               # number of samples; the median is reported
    rotate_bytes: int          # rotate input sets until their total size reaches this
    max_sets: int = 32

    @classmethod
    def for_device(cls, device: str, quick: bool) -> "TimingPlan":
        if device == "cuda":
            # H200: 50 MB of L2; 256 MB of rotating inputs keeps small cases out of it.
            return cls(warmup_calls=25, warmup_s=0.05, sample_s=0.005, samples=30,
                       rotate_bytes=256 << 20)
        if quick:
            return cls(warmup_calls=3, warmup_s=0.005, sample_s=0.004, samples=7,
                       rotate_bytes=0)
        return cls(warmup_calls=5, warmup_s=0.05, sample_s=0.02, samples=15,
                   rotate_bytes=64 << 20)


@dataclasses.dataclass
class Timing:
    median_s: float
    spread_pct: float          # interquartile range of the samples, as % of the median
    min_s: float
    calls_per_sample: int
    samples: int

    def as_dict(self, prefix: str) -> dict:
        return {f"{prefix}_s": self.median_s, f"{prefix}_min_s": self.min_s,
                f"{prefix}_spread_pct": round(self.spread_pct, 2),
                f"{prefix}_calls_per_sample": self.calls_per_sample}


def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def n_input_sets(bytes_per_set: int, plan: TimingPlan) -> int:
    if plan.rotate_bytes <= 0 or bytes_per_set <= 0:
        return 1
    return max(1, min(plan.max_sets, math.ceil(plan.rotate_bytes / bytes_per_set)))


def _quartiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def measure(call: Callable, arg_sets: Sequence[tuple], device: str, plan: TimingPlan) -> Timing:
    """Median seconds per call of ``call(*args)``, args rotating over arg_sets."""
    timings, errors = measure_many({"call": call}, arg_sets, device, plan)
    if errors:
        raise errors["call"]
    return timings["call"]


def measure_many(calls: dict, arg_sets: Sequence[tuple], device: str, plan: TimingPlan):
    """``measure`` for several implementations of one case, their samples interleaved (one
    sample of each in turn): a host whose load drifts during the run (this CPU machine is
    shared) moves them alike, so their ratios hold. Returns ({name: Timing}, {name: exception})
    for the ones that raised, which are dropped from the rest of the run."""
    n = len(arg_sets)
    inner: dict = {}
    errors: dict = {}
    for name, call in calls.items():
        try:
            inner[name] = _warm_and_calibrate(call, arg_sets, device, plan)
        except Exception as e:  # noqa: BLE001 - reported per implementation
            errors[name] = e
    samples: dict = {name: [] for name in inner}
    start = end = None
    if device == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
    for _ in range(plan.samples):
        for name in list(samples):
            call, k = calls[name], inner[name]
            try:
                if device == "cuda":
                    torch.cuda.synchronize()
                    start.record()
                    for j in range(k):
                        call(*arg_sets[j % n])
                    end.record()
                    end.synchronize()
                    samples[name].append(start.elapsed_time(end) * 1e-3 / k)
                else:
                    t0 = time.perf_counter()
                    for j in range(k):
                        call(*arg_sets[j % n])
                    samples[name].append((time.perf_counter() - t0) / k)
            except Exception as e:  # noqa: BLE001
                errors[name] = e
                del samples[name]
    timings = {}
    for name, xs in samples.items():
        med = statistics.median(xs)
        lo, hi = _quartiles(xs)
        timings[name] = Timing(med, 100.0 * (hi - lo) / med if med > 0 else 0.0, min(xs), inner[name], len(xs))
    return timings, errors


def _warm_and_calibrate(call: Callable, arg_sets: Sequence[tuple], device: str, plan: TimingPlan) -> int:
    """Warm up, then the number of calls that makes one sample last about ``plan.sample_s``."""
    n = len(arg_sets)
    # Warm-up: first-call costs (compilation, allocator growth, lazy init) stay out of the numbers.
    i = 0
    t0 = time.perf_counter()
    while i < plan.warmup_calls or time.perf_counter() - t0 < plan.warmup_s:
        call(*arg_sets[i % n])
        i += 1
    sync(device)
    # Calibrate calls per sample from a host-clock run (synchronized at both ends).
    k = max(1, min(n, 8))
    t0 = time.perf_counter()
    for j in range(k):
        call(*arg_sets[j % n])
    sync(device)
    per_call = max((time.perf_counter() - t0) / k, 1e-7)
    return max(1, math.ceil(plan.sample_s / per_call))


def first_call(call: Callable, args: tuple, device: str) -> tuple[float, object]:
    """Wall time of one call, synchronized, and its result."""
    sync(device)
    t0 = time.perf_counter()
    out = call(*args)
    sync(device)
    return time.perf_counter() - t0, out
