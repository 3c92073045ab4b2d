"""What the KILN_LOGS channels print, formatted from the stages' IR (kiln/log.py routes here).

``pass_done`` is called after every pass (``context.run_pass``); the other functions at the
driver's events that are not passes (a capture, its guards, a recompile), by
``kiln/observe/__init__.py``'s subscriber. Each function writes the concise lines with ``log.log`` and the verbose ones with ``log.detail``.
"""
from __future__ import annotations

import os
import re

from kiln import log
from kiln.capture.guards import explain_failure

_ORIGIN_LINE = re.compile(r"\[(.+?):(\d+): ")


def origin_lines(origins) -> list[str]:
    """``file.py:12`` for each distinct source line in a kernel's ``from:`` origins."""
    seen = []
    for o in origins or ():
        m = _ORIGIN_LINE.search(str(o))
        if m:
            where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            if where not in seen:
                seen.append(where)
    return seen


def kernel_line(k) -> str:
    lang = "Triton" if hasattr(k, "num_warps") else "C++"
    size = getattr(k, "numel", None)
    if size is None and getattr(k, "scalars", None):
        size = k.scalars[0]
    lines = origin_lines(getattr(k, "origins", ()))
    return (f"{k.name} ({lang}{'' if size is None else f', {size} elements'}): from "
            f"{', '.join(lines) if lines else 'no source line'}")


def launch_config(k) -> str:
    if hasattr(k, "num_warps"):
        return (f"{k.name}: grid {k.grid}, {k.constexprs}, num_warps {k.num_warps}, "
                f"scalars {list(k.scalars)}" + (" (autotuned)" if getattr(k, "tune", None) else ""))
    return f"{k.name}: C++ over {getattr(k, 'numel', '?')} elements, sizes {list(getattr(k, 'sizes', ()))}"


def _graph_name(ir) -> str:
    return getattr(ir, "name", "?")


def pass_done(stage: str, name: str, seconds: float, out):
    log.detail("perf", "%s/%s took %.2f ms", stage, name, seconds * 1e3)
    if stage == "meta" and name == "propagate_meta":
        log.detail("graph", "%s after meta propagation:\n%s", _graph_name(out), out)
    elif stage == "autograd" and name == "build_joint":
        log.detail("aot", "joint graph:\n%s", getattr(getattr(out, "graph", None), "python", lambda: out)())
    elif stage == "decomp" and not name.startswith("verify"):
        if name == "cse":
            log.log("decomp", "prims graph of %s:\n%s", _graph_name(out), out)
        else:
            log.detail("decomp", "after decomp/%s:\n%s", name, out)
    elif stage == "lowering":
        log.detail("ir", "loop IR after lowering/%s (before fusion):\n%s", name, out)
    elif stage == "scheduling":
        log.log("ir", "loop IR after scheduling/%s (fused):\n%s", name, out)
        kernels, externs = getattr(out, "kernels", []), getattr(out, "externs", [])
        log.log("schedule", "%d kernels, %d library calls", len(kernels), len(externs))
        for k in kernels:
            log.detail("schedule", "%s computes %s (stores %s)", k.name,
                       ", ".join(getattr(n, "name", "?") for n in k.nodes), list(k.stores))
    elif stage == "codegen" and name == "generate_kernels" and isinstance(out, dict):
        for k in out.values():
            log.log("kernels", "generated %s", kernel_line(k))
            log.detail("kernels", "  %s takes buffers %s", k.name, list(getattr(k, "args", ())))
            log.detail("output_code", "launch %s", launch_config(k))
    elif stage == "build":
        log.log("kernels", "build stage took %.0f ms", seconds * 1e3)


def captured(name: str, capture):
    """After capture: the bytecode, the graph and the guards of one compile."""
    text = getattr(capture, "bytecode", "") or ""
    listing, _, executed = text.partition("# executed instructions")
    log.log("bytecode", "%s", listing.rstrip())
    if executed.strip():
        log.detail("bytecode", "executed instructions:%s", executed.rstrip())
    log.log("graph", "captured graph of %s:\n%s", name, capture.graph.python())
    if log.verbose("graph"):
        sources = getattr(capture, "input_sources", ())
        rows = [f"  {n.name} <- {s}" for n, s in zip(capture.graph.placeholders, sources)]
        log.detail("graph", "inputs of %s:\n%s", name, "\n".join(rows) or "  (none)")


def guards(name: str, capture):
    """The guards of a finished compile (after later stages added shape guards)."""
    log.log("guards", "guards of %s:\n%s", name, capture.guard_source)
    if log.verbose("guards"):
        log.detail("guards", "%d checks of %s:\n  %s", len(capture.guards), name,
                   "\n  ".join(capture.guards) or "(none)")
        env = getattr(capture, "shape_env", None)
        if env is not None:
            log.detail("guards", "symbols of %s:\n  %s", name, "\n  ".join(env.describe()))


def recompile_detail(entries, L, G):
    """+recompiles: the first failing check of every cache entry, newest first."""
    if not log.verbose("recompiles"):
        return
    for i, entry in enumerate(reversed(entries)):
        guard_set = getattr(entry.capture, "guard_set", None)
        why = explain_failure(guard_set, L, G) if guard_set is not None else None
        log.detail("recompiles", "  entry %d (compile #%s): %s", len(entries) - 1 - i,
                   getattr(entry, "compile_id", "?"), why or "its checks pass (grad mode differs)")
