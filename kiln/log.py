"""KILN_LOGS: one logger per channel, plus structured events the report reads.

``KILN_LOGS=graph,guards`` turns channels on; ``+graph`` makes one verbose; ``all`` turns on
everything; ``help`` lists the channels.
"""
from __future__ import annotations

import logging
import os
import sys

CHANNELS = {
    "graph": "the captured graph of each compile, as Python",
    "guards": "the guard function of each cache entry",
    "graph_breaks": "each graph break, with its reason and source line",
    "recompiles": "each recompile, with the guard that failed; fallbacks to eager",
    "bytecode": "the bytecode that capture interpreted",
    "dynamic": "symbolic sizes: symbols created, shape guards",
    "aot": "the forward and backward graphs, saved tensors",
    "decomp": "the prims graph after decomposition",
    "ir": "the loop IR before and after fusion",
    "schedule": "why each candidate pair was or wasn't fused",
    "kernels": "each kernel generated and built, with timings",
    "output_code": "the wrapper and every kernel's source",
    "perf": "time per stage of each compile",
    "cache": "disk cache hits, misses and rebuilt entries",
    "autotune": "each Triton kernel's tuning: configs tried, their times, the choice",
    "cudagraphs": "mode='reduce-overhead': each graph recorded, or why it was not",
}

_enabled: dict[str, bool] = {}  # channel -> verbose?
_configured = False


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time (so redirection and capture work)."""

    def emit(self, record):
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record):
        return f"[kiln:{record.name.split('.')[-1]}] {record.getMessage()}"


def configure(spec: str | None = None):
    global _configured
    _configured = True
    spec = os.environ.get("KILN_LOGS", "") if spec is None else spec
    _enabled.clear()
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if "help" in items:
        print(help_text(), file=sys.stderr)
        items.remove("help")
    for item in items:
        verbose = item.startswith("+")
        name = item.lstrip("+")
        names = list(CHANNELS) if name == "all" else [name]
        for n in names:
            if n not in CHANNELS:
                print(f"[kiln] KILN_LOGS: unknown channel {n!r}; KILN_LOGS=help lists them", file=sys.stderr)
                continue
            _enabled[n] = verbose
    root = logging.getLogger("kiln")
    if not root.handlers:
        h = _StderrHandler()
        h.setFormatter(_Formatter())
        root.addHandler(h)
        root.propagate = False
    root.setLevel(logging.DEBUG if _enabled else logging.WARNING)


def help_text() -> str:
    width = max(map(len, CHANNELS))
    lines = ["KILN_LOGS channels (comma separated; +name for verbose, 'all' for every channel):"]
    lines += [f"  {name.ljust(width)}  {desc}" for name, desc in CHANNELS.items()]
    return "\n".join(lines)


def enabled(channel: str) -> bool:
    if not _configured:
        configure()
    return channel in _enabled


def verbose(channel: str) -> bool:
    return enabled(channel) and _enabled[channel]


def log(channel: str, msg, *args):
    if channel not in CHANNELS:
        raise KeyError(f"unknown log channel {channel!r}")
    if enabled(channel):
        logging.getLogger(f"kiln.{channel}").info(msg, *args)


def warn(msg, *args):
    if not _configured:
        configure()
    logging.getLogger("kiln").warning(msg, *args)


_PASS_CHANNELS = {"decomp": "decomp", "lowering": "ir", "scheduling": "ir"}


def pass_done(stage: str, name: str, seconds: float, out):
    if enabled("perf"):
        log("perf", "%s/%s took %.2f ms", stage, name, seconds * 1e3)
    channel = _PASS_CHANNELS.get(stage)
    if channel and enabled(channel) and (verbose(channel) or stage != "lowering"):
        log(channel, "after %s/%s:\n%s", stage, name, out)
