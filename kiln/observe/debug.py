"""KILN_DEBUG=1: one folder per compile with every stage's artifact, in pipeline order.

    kiln_debug/run_<time>_<pid>/<compile_id>/
        00_bytecode.txt  01_guards.py  02_captured_graph.py  02a_forward_graph.py
        02b_backward_graph.py (training only)  03_prims_graph.py
        04_loop_ir.txt  05_loop_ir_fused.txt  06_kernel_<name>.{py,cpp}  07_wrapper.py
        metrics.json

Graph files are runnable: ``python 02_captured_graph.py`` runs the graph on random inputs of
the recorded shapes.
"""
from __future__ import annotations

import json
import os
import time

from kiln.config import config
from kiln.graph.node import PLACEHOLDER

_run_dir = None


def run_dir() -> str:
    global _run_dir
    if _run_dir is None:
        stamp = time.strftime("%Y%m%d_%H%M%S")
        _run_dir = os.path.join(config.debug_dir, f"run_{stamp}_{os.getpid()}")
        os.makedirs(_run_dir, exist_ok=True)
    return _run_dir


def runnable_graph_source(graph) -> str:
    lines = ["import torch", "from kiln.meta import TensorMeta",
             "from kiln.ops import core, prims", "from kiln.graph import graph", "",
             "inf, nan = float('inf'), float('nan')", "constants = {}", "", graph.python(), "",
             'if __name__ == "__main__":', "    inputs = ["]
    for n in graph.nodes:
        if n.op == PLACEHOLDER:
            m = n.meta["val"]
            lines.append(f"        TensorMeta({tuple(m.shape)}, {tuple(m.stride)}, {m.dtype}, "
                         f"{str(m.device)!r}).random(),")
    lines += ["    ]", f"    for out in {graph.name}(*inputs):",
              "        print(getattr(out, 'shape', out), getattr(out, 'dtype', ''))"]
    return "\n".join(lines) + "\n"


_FILES = [
    ("capture", "bytecode", "00_bytecode.txt", str),
    ("capture", "guards", "01_guards.py", str),
    ("capture", "captured_graph", "02_captured_graph.py", runnable_graph_source),
    ("autograd", "forward_graph", "02a_forward_graph.py", runnable_graph_source),
    ("autograd", "backward_graph", "02b_backward_graph.py", runnable_graph_source),
    ("decomp", "cse", "03_prims_graph.py", runnable_graph_source),
    ("lowering", "lower", "04_loop_ir.txt", str),
    ("scheduling", "schedule", "05_loop_ir_fused.txt", str),
    ("codegen", "generate_wrapper", "07_wrapper.py", str),
]


def new_run() -> str:
    """Start a fresh run folder (the next dump goes there)."""
    global _run_dir
    _run_dir = None
    return run_dir()


def _break_record(b) -> dict:
    """A graph break (capture.Unsupported) as JSON: reason and where it happened."""
    return {"reason": getattr(b, "reason", str(b)), "filename": getattr(b, "filename", None),
            "lineno": getattr(b, "lineno", None), "source_line": getattr(b, "source_line", None),
            "text": str(b)}


def folder_name(ctx) -> str:
    """The dump folder of a compile, relative to the run folder (the profiler keys on it)."""
    return f"{ctx.compile_id:03d}_{ctx.name.replace('.', '_').replace('<', '').replace('>', '')}"


def write_dump(ctx, compiled) -> str:
    """Write ctx's artifacts; ``compiled`` is None when the compile ended in a graph break."""
    folder = os.path.join(run_dir(), folder_name(ctx))
    os.makedirs(folder, exist_ok=True)
    have = {name: ir for _, name, ir in ctx.artifacts}
    written = []
    for _, name, filename, render in _FILES:
        if name in have:
            with open(os.path.join(folder, filename), "w") as f:
                f.write(render(have[name]))
            written.append(filename)
    for k in ctx.kernels:
        ext = "cpp" if "extern \"C\"" in k.source else "py"
        filename = f"06_kernel_{k.name}.{ext}"
        with open(os.path.join(folder, filename), "w") as f:
            f.write(k.source)
        written.append(filename)
    metrics = {
        "compile_id": ctx.compile_id,
        "name": ctx.name,
        "stage_seconds": ctx.stage_times,
        "passes": [{"stage": s, "pass": p, "seconds": t} for s, p, t in ctx.pass_times],
        "kernel_count": ctx.kernel_count,
        "extern_calls": ctx.extern_calls,
        "graph_breaks": [_break_record(b) for b in ctx.graph_breaks],
        "events": ctx.events,  # e.g. {"kind": "recompile", "reason": "guard failed: ..."}
        "guards": ctx.guards,
        "kernels": [{"name": k.name, "origins": list(getattr(k, "origins", None) or ())}
                    for k in ctx.kernels],
        "files": sorted(written),
    }
    with open(os.path.join(folder, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    return folder
