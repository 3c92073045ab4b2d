"""KILN_DEBUG=1: one folder per compile with every stage's artifact, in pipeline order.

    kiln_debug/run_<time>_<pid>/<compile_id>/
        00_bytecode.txt  01_guards.py  01a_shape_env.txt (symbolic sizes)  02_captured_graph.py
        02a_forward_graph.py
        02b_backward_graph.py (training only)  03_prims_graph.py
        04_loop_ir.txt  05_loop_ir_fused.txt  05a_loop_ir.py  06_kernel_<name>.{py,cpp}
        07_wrapper.py  metrics.json

Graph files are runnable: ``python 02_captured_graph.py`` runs the graph on random inputs of
the recorded shapes (symbolic sizes at the values they were traced at). ``05a_loop_ir.py`` is
the fused loop IR as Python over torch tensors (``inductor/loop_python.py``): its ``call`` takes
what the compiled wrapper in ``07_wrapper.py`` takes.

A function with a graph break has one folder per graph: the function's own compile (the graph
up to the break) and one per resume function (``001_f_resume_at_24``). A backward graph is
compiled at the first ``backward()`` and gets its own folder (``002_f_backward``), whose
``metrics.json`` names the forward's compile id (``backward_of``).
"""
from __future__ import annotations

import json
import os
import time

import re

from kiln.config import config
from kiln.graph.node import PLACEHOLDER
from kiln.inductor.loop_python_program import program_python

_run_dir = None


def run_dir() -> str:
    global _run_dir
    if _run_dir is None:
        stamp = time.strftime("%Y%m%d_%H%M%S")
        _run_dir = os.path.join(config.debug_dir, f"run_{stamp}_{os.getpid()}")
        os.makedirs(_run_dir, exist_ok=True)
    return _run_dir


def write_eager_runs(records: list[dict]):
    """The run folder's list of eager runs (the report reads it; a run folder has no compile
    for a frame that never compiled, such as one past the recompile limit)."""
    path = os.path.join(run_dir(), "eager_runs.json")
    with open(path + ".tmp", "w") as f:
        json.dump(records, f, indent=2)
    os.replace(path + ".tmp", path)


def graph_symbols(graph) -> dict:
    """{symbol name: traced value} of every symbolic size or stride the graph's metas hold."""
    out: dict = {}

    def visit(v):
        if isinstance(v, (tuple, list)):
            for x in v:
                visit(x)
            return
        for attr in ("shape", "stride"):
            for d in getattr(v, attr, ()) if hasattr(v, "dtype") else ():
                env, expr = getattr(d, "env", None), getattr(d, "expr", None)
                if expr is None:
                    continue
                for sym in expr.free_symbols:
                    hint = getattr(env, "hints", {}).get(sym)
                    out.setdefault(str(sym), None if hint is None else int(hint))
    for n in graph.nodes:
        visit(n.meta.get("val"))
    return out


_RANDOM_INPUT = """def random_input(shape, stride, dtype, device):
    # random values of the recorded shape and strides; integers in [0, 2): valid indices
    size = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(size, dtype=dtype if dtype.is_complex else torch.float32).to(dtype)
    elif dtype == torch.bool:
        base = torch.rand(size) > 0.5
    else:
        base = torch.randint(0, 2, (size,)).to(dtype)
    return torch.as_strided(base.to(device), shape, stride)
"""


def runnable_graph_source(graph) -> str:
    """The graph as a script: ``python FILE`` runs it on random inputs of the recorded shapes.
    Symbolic sizes (``s0``) are module globals holding the sizes the graph was traced at."""
    symbols = graph_symbols(graph)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lines = ["import sys", "", "import torch", "", "try:", "    import kiln  # noqa: F401",
             "except ImportError:  # run from anywhere: the kiln that wrote this file",
             f"    sys.path.insert(0, {root!r})",
             "import kiln  # noqa: E402,F811  (registers every op)",
             "from kiln.graph import graph  # noqa: E402", "from kiln.ops.registry import lookup  # noqa: E402", "",
             "",
             "class _Ops:  # core.<name> / prims.<name>: every registered op, whichever file defines it",
             "    def __init__(self, namespace):",
             "        self.namespace = namespace",
             "",
             "    def __getattr__(self, name):",
             "        return lookup(self.namespace, name)",
             "",
             "",
             "core, prims = _Ops('core'), _Ops('prims')",
             "inf, nan = float('inf'), float('nan')", "constants = {}"]
    if symbols:
        lines += ["import math  # noqa: E402", "",
                  "# how size expressions print (s0 // 2 is floor(s0/2)), on plain ints",
                  "floor, ceiling, Max, Min = math.floor, math.ceil, max, min",
                  "Mod = lambda a, b: a % b  # noqa: E731",
                  "FloorDiv = lambda a, b: a // b  # noqa: E731", ""]
        lines.append("# symbolic sizes, at the values they had when the graph was traced")
        for name, hint in sorted(symbols.items()):
            lines.append(f"{name} = {8 if hint is None else hint}" +
                         ("  # no traced value recorded: any size >= 2" if hint is None else ""))
    lines += ["", _RANDOM_INPUT, "", graph.python(), "", 'if __name__ == "__main__":',
              "    inputs = ["]
    for n in graph.nodes:
        if n.op == PLACEHOLDER:
            m = n.meta["val"]
            lines.append(f"        random_input({_tuple(m.shape)}, {_tuple(m.stride)}, {m.dtype}, "
                         f"{str(m.device)!r}),")
    lines += ["    ]", f"    for out in {graph.name}(*inputs):",
              "        print(getattr(out, 'shape', out), getattr(out, 'dtype', ''))"]
    return "\n".join(lines) + "\n"


def _tuple(seq) -> str:
    """A shape or stride as Python source (symbolic entries by their expression: ``s0*4``)."""
    items = [str(getattr(x, "expr", x)) for x in seq]
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"


_FILES = [
    ("capture", "bytecode", "00_bytecode.txt", str),
    ("capture", "guards", "01_guards.py", str),
    ("capture", "shape_env", "01a_shape_env.txt", str),
    ("capture", "captured_graph", "02_captured_graph.py", runnable_graph_source),
    ("autograd", "forward_graph", "02a_forward_graph.py", runnable_graph_source),
    ("autograd", "backward_graph", "02b_backward_graph.py", runnable_graph_source),
    ("decomp", "cse", "03_prims_graph.py", runnable_graph_source),
    ("lowering", "lower", "04_loop_ir.txt", str),
    ("scheduling", "schedule", "05_loop_ir_fused.txt", str),
    ("scheduling", "schedule", "05a_loop_ir.py", lambda sched: _loop_python(sched)),
    ("codegen", "generate_wrapper", "07_wrapper.py", str),
]


def _loop_python(sched) -> str:
    """The schedule as Python; a kernel it cannot print leaves a note, not a failed dump."""
    try:
        return program_python(sched)
    except Exception as e:  # noqa: BLE001 - a debugging aid must not break the dump
        return f"# the loop IR could not be printed as Python: {type(e).__name__}: {e}\n"


def end_run():
    """The next dump starts a new run folder (profile() ends its own run this way)."""
    global _run_dir
    _run_dir = None


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
    name = re.sub(r"[^A-Za-z0-9_]+", "_", ctx.name.replace("<", "").replace(">", "")).strip("_")
    return f"{ctx.compile_id:03d}_{name or 'graph'}"


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
    backward_of = next((e["compile_id"] for e in ctx.events if e.get("kind") == "backward_of"), None)
    metrics = {
        "compile_id": ctx.compile_id,
        "name": ctx.name,
        # "function" (a compiled function's own frame), "resume" (a resume function after a
        # graph break) or "backward" (compiled at the first backward of compile backward_of)
        "kind": "backward" if backward_of is not None else "resume" if "<resume at" in ctx.name
        else "function",
        "backward_of": backward_of,
        "has_graph": "captured_graph" in have or "backward_graph" in have and backward_of is not None,
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
