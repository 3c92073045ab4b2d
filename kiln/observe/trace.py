"""A Chrome / Perfetto trace (``traceEvents`` JSON) from kiln's ``profile.json``.

``profile.json`` (kiln.observe.profile) is kiln's own format, read by the HTML report; this
writes the same timeline in the Trace Event Format, which ui.perfetto.dev and
chrome://tracing load: one complete event (``ph: "X"``, microseconds) per timeline entry, one
thread per lane (run, call, graph, kernel, torch op, sync, device), named by metadata events.
Kernel events carry their measured figures (median time, bytes moved, bandwidth) as ``args``.
"""
from __future__ import annotations

import json
import os

PID = 1
LANE_ORDER = ("run", "call", "graph", "kernel", "torch op", "sync", "device")


def _tid(lane: str) -> int:
    return LANE_ORDER.index(lane) + 1 if lane in LANE_ORDER else len(LANE_ORDER) + 1


def _kernel_args(prof: dict) -> dict:
    """``kiln kernel F/K`` and ``kiln device F/K`` -> that kernel's figures from the profile."""
    out = {}
    for k in prof.get("kernels", []):
        args = {key: k[key] for key in ("calls", "median_us", "min_us", "bytes", "gb_per_s", "source")
                if k.get(key) is not None}
        for kind in ("kernel", "device"):
            out[f"kiln {kind} {k['folder']}/{k['kernel']}"] = args
    return out


def chrome_trace(prof: dict) -> dict:
    """The trace of one profile (the parsed ``profile.json``)."""
    args_of = _kernel_args(prof)
    events = []
    lanes = []
    for e in prof.get("timeline", []):
        lane = e.get("lane", "other")
        if lane not in lanes:
            lanes.append(lane)
        ev = {"name": e["name"], "cat": lane, "ph": "X", "ts": float(e["start_us"]),
              "dur": float(e["dur_us"]), "pid": PID, "tid": _tid(lane)}
        if e["name"] in args_of:
            ev["args"] = args_of[e["name"]]
        events.append(ev)
    meta = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
             "args": {"name": f"kiln: {prof.get('program', '?')} on {prof.get('device', '?')}"}}]
    for lane in lanes:
        meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": _tid(lane), "args": {"name": lane}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": _tid(lane),
                     "args": {"sort_index": _tid(lane)}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"program": prof.get("program"), "runs": prof.get("runs"),
                          "timing": prof.get("timing")}}


def write_trace(prof: dict, out: str) -> str:
    with open(out, "w") as f:
        json.dump(chrome_trace(prof), f)
    return out


def trace_path(html_path: str) -> str:
    """The trace beside the page: ``trace.json`` next to a page named ``report.html`` (the
    run folder's own), ``NAME.trace.json`` next to any other ``NAME.html``."""
    base, _ = os.path.splitext(html_path)
    if os.path.basename(base) == "report":
        return os.path.join(os.path.dirname(base), "trace.json")
    return base + ".trace.json"
