"""kiln.explain: compile a call while watching, and say what happened."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from kiln import api, context, eager_runs
from kiln.observe.logs import kernel_line


@dataclasses.dataclass
class BreakReason:
    reason: str
    filename: str
    lineno: int
    source_line: str

    def __str__(self):
        return f"{self.reason} at {self.filename}:{self.lineno}: {self.source_line.strip()}"


@dataclasses.dataclass
class EagerRun:
    reason: str
    name: str
    filename: str
    lineno: int
    source_line: str
    count: int  # runs during the explained call

    def __str__(self):
        return (f"{self.name} ran eagerly ({self.count}x): {self.reason} at {self.filename}:"
                f"{self.lineno}: {self.source_line.strip()}")


@dataclasses.dataclass
class CompileSummary:
    """One compile of the explained call: the function's own frame or a resume function."""
    compile_id: int
    name: str
    graph: object            # the captured graph, or None (a prefix that computes nothing)
    breaks: list             # BreakReason
    guards: list
    kernels: list            # the generated kernels (.name, .source, .origins)
    extern_calls: int
    compile_times: dict

    def __str__(self):
        total = sum(self.compile_times.values())
        ops = f"{self.graph.ops_count()} ops" if self.graph is not None else "no graph"
        lines = [f"--- compile {self.compile_id}: {self.name} ({ops}, {len(self.kernels)} kernels, "
                 f"{self.extern_calls} library calls, compiled in {total * 1e3:.1f} ms) ---"]
        for b in self.breaks:
            lines.append(f"  graph break: {b}")
        if self.graph is not None:
            lines += ["  " + ln for ln in self.graph.python().rstrip().splitlines()]
        for k in self.kernels:
            lines.append(f"  kernel {kernel_line(k)}")
        if self.guards:
            lines.append(f"  guards ({len(self.guards)}):")
            lines += [f"    {g}" for g in self.guards]
        return "\n".join(lines)


@dataclasses.dataclass
class ExplainOutput:
    graphs: list
    graph_count: int
    graph_break_count: int
    break_reasons: list
    guards: list
    ops_per_graph: list
    compile_times: dict
    kernel_count: int
    extern_calls: int
    kernels: list
    wrappers: list
    result: object = None
    compiles: list = dataclasses.field(default_factory=list)  # CompileSummary, in compile order
    kernels_per_graph: list = dataclasses.field(default_factory=list)  # kernel names per graph
    # frames (or rests of frames) that ran natively during the call (kiln/eager_runs.py)
    eager_runs: list = dataclasses.field(default_factory=list)  # EagerRun

    def __str__(self):
        lines = [f"Graphs: {self.graph_count}   Graph breaks: {self.graph_break_count}   "
                 f"Kernels: {self.kernel_count}   Library calls: {self.extern_calls}"]
        for i, b in enumerate(self.break_reasons):
            lines.append(f"Break {i + 1}: {b}")
        for r in self.eager_runs:
            lines.append(f"Eager: {r}")
        if self.compiles:
            lines += [str(c) for c in self.compiles]
        else:  # built by hand, without per-compile records
            for i, (g, n) in enumerate(zip(self.graphs, self.ops_per_graph)):
                lines.append(f"--- graph {i} ({n} ops) ---")
                lines.append(g.python().rstrip())
            if self.guards:
                lines.append(f"--- guards ({len(self.guards)}) ---")
                lines += [f"  {g}" for g in self.guards]
        if self.compile_times:
            total = sum(self.compile_times.values())
            lines.append(f"--- compile time {total * 1e3:.1f} ms ---")
            for stage in context.STAGES:
                if stage in self.compile_times:
                    lines.append(f"  {stage:<11} {self.compile_times[stage] * 1e3:8.1f} ms")
        return "\n".join(lines)


def explain(fn: Callable[..., Any] | torch.nn.Module, backend: str = "kiln",
            dynamic: bool | None = None) -> Callable[..., ExplainOutput]:
    """``kiln.explain(fn)(*args, **kwargs)`` -> ExplainOutput (compiles afresh, caches nothing).
    ``dynamic`` as for ``kiln.compile``; the guards listed include the shape guards on symbolic
    sizes (``L['x'].size(0) >= 2``)."""
    def run(*args, **kwargs):
        target = fn.forward if hasattr(fn, "forward") and callable(getattr(fn, "forward")) \
            and not isinstance(fn, api.CompiledFunction) else fn
        if isinstance(fn, api.CompiledModule):
            target = fn._orig_mod.forward
        elif isinstance(fn, api.CompiledFunction):
            target = fn.fn
        dyn = dynamic if dynamic is not None else getattr(fn, "dynamic", None)
        compiled = api.CompiledFunction(target, backend=backend, dynamic=dyn, private_cache=True)
        recorder: list = []
        eager: list = []
        before = {id(r): r["count"] for r in eager_runs._RECORDS.values()}
        api._RECORDERS.append(recorder)
        eager_runs._LISTENERS.append(eager)
        try:
            result = compiled(*args, **kwargs)
        finally:
            api._RECORDERS.remove(recorder)
            eager_runs._LISTENERS.remove(eager)
        out = summarize(recorder, result)
        out.eager_runs = [EagerRun(r["reason"], r["name"], r["filename"] or "", r["lineno"] or 0,
                                   r["source_line"], r["count"] - before.get(id(r), 0)) for r in eager]
        return out
    return run


def summarize(contexts, result=None) -> ExplainOutput:
    graphs, ops, guards, breaks, compiles, per_graph = [], [], [], [], [], []
    times: dict = {}
    kernels, externs, kernel_list, wrappers = 0, 0, [], []
    for ctx in contexts:
        graph = None
        for stage, name, ir in ctx.artifacts:
            if name == "captured_graph":
                graph = ir
                graphs.append(ir)
                ops.append(ir.ops_count())
                per_graph.append([k.name for k in ctx.kernels])
        mine = [BreakReason(b.reason, b.filename, b.lineno, b.source_line or "") for b in ctx.graph_breaks]
        breaks.extend(mine)
        guards.extend(ctx.guards)
        for k, v in ctx.stage_times.items():
            times[k] = times.get(k, 0.0) + v
        kernels += ctx.kernel_count
        externs += ctx.extern_calls
        kernel_list.extend(ctx.kernels)
        wrappers.extend(ir for _, name, ir in ctx.artifacts if name == "generate_wrapper")
        compiles.append(CompileSummary(ctx.compile_id, ctx.name, graph, mine, list(ctx.guards),
                                       list(ctx.kernels), ctx.extern_calls, dict(ctx.stage_times)))
    return ExplainOutput(graphs, len(graphs), len(breaks), breaks, guards, ops, times, kernels,
                         externs, kernel_list, wrappers, result, compiles, per_graph)
