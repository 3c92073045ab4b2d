"""Named regions in the user's own ``torch.profiler`` trace.

Every compiled call made while a profiler is on runs inside
``record_function("kiln: <fn> [<compile id>]")``, and each generated kernel it launches inside
``record_function("kiln kernel: <kernel>")``, so a trace shows which compiled frame ran and
which kernels it launched (eager ops the wrapper calls, and CUDA kernels through their launch,
nest under the region on their own).

Cost when no profiler is on: the call path asks ``torch.autograd._profiler_enabled()`` (one C
call) and nothing else; kernels are called directly. The per-kernel shims are installed into
the wrappers' namespaces (the wrapper looks its kernels up by name, pipeline.build) only on
the first compiled call made under a profiler, and a shim called once the profiler is off puts
the plain kernel back, so after profiling the call path is as before.
"""
from __future__ import annotations

import threading
import weakref

import torch

enabled = torch.autograd._profiler_enabled  # the cheap check: no Python frame
_record = torch.autograd.profiler.record_function

_wrappers: list = []  # (weakref to a generated wrapper function, its kernel names)
_lock = threading.Lock()
_installed = [False]  # every registered wrapper's kernels are shims (until one is called unprofiled)
_live = [64]  # live registrations at the last prune (at least 64): pruning is amortized


def region_name(fn_name: str, compile_id) -> str:
    return f"kiln: {fn_name} [{compile_id}]"


def run(fn_name: str, entry, L):
    """``entry.run(L)`` inside its named region (the caller checked ``enabled()``)."""
    if not _installed[0]:
        install()
    with _record(region_name(fn_name, entry.compile_id)):
        return entry.run(L)


def register(call, kernel_names) -> None:
    """A wrapper built by pipeline.build: its kernels get shims while a profiler is on."""
    names = tuple(kernel_names)
    if not names:
        return
    with _lock:
        _wrappers.append((weakref.ref(call), names))
        if len(_wrappers) > 2 * _live[0]:  # graphs dropped (kiln.reset, recompiles) leave dead refs
            _prune()
        if _installed[0]:  # built under the profiler (a compile inside the profiled run)
            _install_one(call.__globals__, names)


def install() -> None:
    with _lock:
        for call, names in _prune():
            _install_one(call.__globals__, names)
        _installed[0] = True


def _prune() -> list:
    """Drops dead registrations; returns the live wrappers (strong references) with their kernels."""
    live = [(ref(), ref, names) for ref, names in _wrappers]
    live = [(call, ref, names) for call, ref, names in live if call is not None]
    _wrappers[:] = [(ref, names) for _, ref, names in live]
    _live[0] = max(64, len(_wrappers))
    return [(call, names) for call, _, names in live]


def _install_one(namespace: dict, names) -> None:
    for name in names:
        # a launch line built beside the wrapper (codegen/wrapper._triton_call) is what the
        # wrapper calls for a Triton kernel; either slot may hold it
        for slot in (name, f"{name}_launch"):
            fn = namespace.get(slot)
            # kiln.observe.profile's timing shims record a range of their own
            if fn is not None and not getattr(fn, "kiln_records_range", False):
                namespace[slot] = _KernelRegion(fn, f"kiln kernel: {name}", namespace, slot)


class _KernelRegion:
    """Stands in for one kernel in a wrapper's namespace, however the wrapper spells the call:
    ``k(...)`` (C++ through ctypes, a launch line), ``k[grid](...)`` or ``k.run(...)``."""
    kiln_records_range = True

    def __init__(self, fn, label: str, namespace: dict, slot: str):
        self.fn, self.label, self.namespace, self.slot = fn, label, namespace, slot

    def _unprofiled(self):
        # the profiler is off: the plain kernel goes back, so later calls pay nothing
        if self.namespace.get(self.slot) is self:
            self.namespace[self.slot] = self.fn
        _installed[0] = False

    def _wrap(self, launch):
        def call(*args, **kwargs):
            if not enabled():
                self._unprofiled()
                return launch(*args, **kwargs)
            with _record(self.label):
                return launch(*args, **kwargs)
        return call

    def __call__(self, *args, **kwargs):
        return self._wrap(self.fn)(*args, **kwargs)

    def __getitem__(self, grid):
        return self._wrap(self.fn[grid])

    def __getattr__(self, name):
        value = getattr(self.fn, name)
        return self._wrap(value) if callable(value) else value
