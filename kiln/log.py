"""KILN_LOGS: one logger per channel, plus structured events the report reads.

``KILN_LOGS=graph,guards`` turns channels on; ``+graph`` makes one verbose; ``all`` turns on
everything (``+all``: everything, verbose); ``help`` lists the channels with what each prints
at both levels. A line logged while a compile runs carries its compile id (``[kiln:graph #3]``),
the number of the ``KILN_DEBUG`` dump folder that holds the same compile's artifacts.

Call sites use ``log(channel, ...)`` for what a channel prints by default and
``detail(channel, ...)`` for what only ``+channel`` adds.
"""
from __future__ import annotations

import logging
import os
import sys

# channel -> (what it prints by default, what +channel adds)
CHANNELS = {
    "graph": ("the captured graph of each compile, as Python",
              "each input's source (L['x'], a parameter) and the graph after meta propagation"),
    "guards": ("the guard function of each cache entry (shape guards included)",
               "the checks as a list, and the symbols the shape guards read"),
    "graph_breaks": ("each graph break, with its reason and source line, and how it resumes",
                     "the live values handed to the resume function and the breaking instruction"),
    "recompiles": ("each recompile, with the guard that failed in plain words; fallbacks to eager",
                   "every cache entry's failing check, newest first"),
    "bytecode": ("the disassembly of each code object capture interprets",
                 "the instructions capture executed, in order"),
    "dynamic": ("symbolic sizes: symbols created, automatic-dynamic decisions, each compile's "
                "shape guards", "each shape guard as it is recorded, with the sizes it was decided on"),
    "aot": ("the forward and backward graphs, the saved-tensor total, each backward compile",
            "the joint graph, and each saved tensor with its size"),
    "decomp": ("the prims graph after decomposition", "the prims graph after every decomp pass"),
    "ir": ("the loop IR after fusion", "the loop IR before fusion too"),
    "schedule": ("why each candidate pair was or wasn't fused; kernels per graph",
                 "the buffers each kernel computes"),
    "kernels": ("each kernel generated: language, size, the Python lines it came from",
                "each kernel's buffer arguments, and each build with its time and binary"),
    "output_code": ("the wrapper and every kernel's source", "each kernel's launch configuration"),
    "perf": ("time per stage of each compile", "time of every pass"),
    "cache": ("disk cache hits, misses and rebuilt entries", "the cache paths"),
    "autotune": ("each Triton kernel's tuning choice, each C++ kernel's chunk", "every config tried, with its time"),
    "cudagraphs": ("mode='reduce-overhead': each graph recorded, or why it was not",
                   "each graph recorded, with its inputs copied in and read in place"),
}

_enabled: dict[str, bool] = {}  # channel -> verbose?
_configured = False
# The log sits below the compiler's stages and its observers, which plug in here:
# kiln/context.py names the running compile's id, and kiln/observe/logs.py formats each
# pass's lines (``fn(stage, name, seconds, out)``, called while a channel is on).
compile_id = lambda: None  # noqa: E731
PASS_SUBSCRIBERS: list = []


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time (so redirection and capture work)."""

    def emit(self, record):
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record):
        cid = getattr(record, "compile_id", None)
        tag = record.name.split(".")[-1] + ("" if cid is None else f" #{cid}")
        return f"[kiln:{tag}] {record.getMessage()}"


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
    lines = ["KILN_LOGS channels (comma separated; +name for verbose, 'all' or '+all' for every channel):"]
    for name, (concise, more) in CHANNELS.items():
        lines.append(f"  {name.ljust(width)}  {concise}")
        lines.append(f"  {'+'.rjust(width)}  {more}")
    return "\n".join(lines)


def enabled(channel: str) -> bool:
    if not _configured:
        configure()
    return channel in _enabled


def verbose(channel: str) -> bool:
    return enabled(channel) and _enabled[channel]


def _emit(channel, msg, args):
    logging.getLogger(f"kiln.{channel}").info(msg, *args, extra={"compile_id": compile_id()})


def log(channel: str, msg, *args):
    """What ``channel`` prints when it is on (concise and verbose)."""
    if channel not in CHANNELS:
        raise KeyError(f"unknown log channel {channel!r}")
    if enabled(channel):
        _emit(channel, msg, args)


def detail(channel: str, msg, *args):
    """What only ``+channel`` (verbose) prints."""
    if channel not in CHANNELS:
        raise KeyError(f"unknown log channel {channel!r}")
    if verbose(channel):
        _emit(channel, msg, args)


def warn(msg, *args):
    if not _configured:
        configure()
    logging.getLogger("kiln").warning(msg, *args)


def pass_done(stage: str, name: str, seconds: float, out):
    """Called by ``context.run_pass`` after every pass: the per-pass lines of the channels
    (kiln/observe/logs.py formats them: ``PASS_SUBSCRIBERS``)."""
    if not _configured:
        configure()
    if _enabled:
        for fn in PASS_SUBSCRIBERS:
            fn(stage, name, seconds, out)
