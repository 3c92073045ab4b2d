"""``python -m kiln report DIR``: one self-contained HTML page from a KILN_DEBUG run folder.

    python -m kiln report kiln_debug/run_<time>_<pid>    (or kiln_debug: the newest run)
    python -m kiln report [-o OUT.html] --profile script.py [ARGS...]

The page shows, per compile id, its graph breaks and recompiles (the guard that failed), every
stage's artifact in pipeline order, every kernel with its source and the Python lines its
nodes came from (the ``from:`` lines codegen writes), and, when the run folder holds a
``profile.json`` (see ``kiln.observe.profile``), a timeline with each kernel's measured time
and achieved bandwidth, plus the host synchronizations the program made.

Bandwidth is bytes moved / median measured time, where bytes moved is the size of every
distinct buffer the wrapper passes to the kernel (inputs read once, outputs written once; the
sizes come from the loop IR dump). Re-reads of broadcast inputs and cache effects are not
counted, so this is the kernel's minimum traffic: a lower bound on what the memory system did.
"""
from __future__ import annotations

import argparse
import html
import json
import linecache
import math
import os
import re
import sys

from kiln.observe.profile import SYNC_CALLS, profile, profile_script  # noqa: F401 (public API)
from kiln.observe.trace import trace_path, write_trace

STAGE_OF_FILE = [("00_", "capture: bytecode"), ("01a_", "capture: symbolic sizes"), ("01_", "capture: guards"),
                 ("02a_", "autograd: forward graph"), ("02b_", "autograd: backward graph"),
                 ("02_", "capture: captured graph"), ("03_", "decomp: prims graph"),
                 ("04_", "lowering: loop IR"), ("05_", "scheduling: fused loop IR"),
                 ("06_", "codegen: kernel"), ("07_", "codegen: wrapper"), ("metrics", "metrics")]
STAGES = ("capture", "meta", "autograd", "decomp", "lowering", "scheduling", "codegen", "build")
ORIGIN_RE = re.compile(r"^\s*(?:#|//) from: (.*?)(?:\s+\[(.+):(\d+): (.*)\])?\s*$")
BUFFER_RE = re.compile(r"^(\w+) = [^(\n]*\((\w+)\[([0-9, ]*)\]")
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
# Graph-break reasons that mean the program reads a tensor's value on the host.
SYNC_BREAKS = [(re.compile(r"\bitem\b"), "Tensor.item()"),
               (re.compile(r"data-dependent branch|truth value"), "tensor used as a condition (if/while)"),
               (re.compile(r"call to print"), "print (of a tensor: reads its values)"),
               (re.compile(r"tolist|numpy"), "tensor converted to Python values"),
               (re.compile(r"call to (int|float|bool|complex) on non-constant"),
                "tensor converted to a Python number"),
               (re.compile(r"iterating over a tensor"), "iterating over a tensor")]
LANES = ["run", "call", "graph", "kernel", "torch op", "sync", "device"]


# ------------------------------------------------------------------ reading a run folder
def find_run(path: str) -> str:
    """A run folder: path itself, the run above a compile folder, or the newest run_* in path."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such folder: {path}")
    if os.path.exists(os.path.join(path, "metrics.json")):
        return os.path.dirname(path)
    if os.path.exists(os.path.join(path, "eager_runs.json")) or \
            any(os.path.exists(os.path.join(path, d, "metrics.json")) for d in os.listdir(path)):
        return path
    runs = [os.path.join(path, d) for d in os.listdir(path) if d.startswith("run_")]
    if not runs:
        raise FileNotFoundError(f"{path} holds no KILN_DEBUG run (run_*/ with metrics.json)")
    return max(runs, key=os.path.getmtime)


def _read(path: str, limit: int = 400_000) -> str:
    with open(path, errors="replace") as f:
        text = f.read(limit + 1)
    return text if len(text) <= limit else text[:limit] + "\n... (truncated)\n"


def parse_origins(source: str) -> list[dict]:
    """The ``# from:`` / ``// from:`` lines at the top of a kernel source."""
    out = []
    for line in source.splitlines():
        m = ORIGIN_RE.match(line)
        if m:
            out.append({"node": m.group(1), "filename": m.group(2),
                        "lineno": int(m.group(3)) if m.group(3) else None, "source": m.group(4) or ""})
    return out


def buffer_bytes(loop_ir: str) -> dict:
    """Buffer name -> bytes, from the loop IR dump (``buf0 = Pointwise(float32[64, 128], ...)``)."""
    sizes = {}
    for line in loop_ir.splitlines():
        m = BUFFER_RE.match(line)
        if m and m.group(2) in DTYPE_BYTES:
            dims = [int(d) for d in m.group(3).replace(" ", "").split(",") if d]
            sizes[m.group(1)] = math.prod(dims) * DTYPE_BYTES[m.group(2)]
    return sizes


def kernel_bytes(name: str, wrapper: str, sizes: dict) -> int | None:
    """Bytes of the distinct buffers passed to each launch of kernel ``name`` in the wrapper."""
    total, found = 0, False
    for line in wrapper.splitlines():
        m = re.match(rf"\s*{re.escape(name)}(?:\[.*?\]|\.\w+)?\((.*)\)\s*$", line)
        if m:
            found = True
            total += sum(sizes[a] for a in set(re.findall(r"\b(\w+)\b", m.group(1))) if a in sizes)
    return total if found else None


def load_compile(folder: str) -> dict:
    metrics = json.loads(_read(os.path.join(folder, "metrics.json")))
    files = sorted(f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f)))
    texts = {f: _read(os.path.join(folder, f)) for f in files}
    sizes = buffer_bytes(texts.get("04_loop_ir.txt", ""))
    wrapper = texts.get("07_wrapper.py", "")
    kernels = []
    for f in files:
        if f.startswith("06_kernel_"):
            name = f[len("06_kernel_"):].rsplit(".", 1)[0]
            kernels.append({"name": name, "file": f, "source": texts[f],
                            "lang": "C++" if f.endswith(".cpp") else "Triton",
                            "origins": parse_origins(texts[f]),
                            "bytes": kernel_bytes(name, wrapper, sizes)})
    breaks = [b if isinstance(b, dict) else {"reason": str(b), "filename": None, "lineno": None,
                                              "source_line": None, "text": str(b)}
              for b in metrics.get("graph_breaks", [])]
    return {"folder": os.path.basename(folder), "id": metrics.get("compile_id"),
            "name": metrics.get("name", "?"), "metrics": metrics, "files": files, "texts": texts,
            "kernels": kernels, "breaks": breaks,
            "recompiles": [e for e in metrics.get("events", []) if e.get("kind") == "recompile"],
            "break_events": [e for e in metrics.get("events", []) if e.get("kind") == "graph_break"],
            "kind": metrics.get("kind", "function"), "backward_of": metrics.get("backward_of")}


def load_run(path: str) -> dict:
    run = find_run(path)
    compiles = [load_compile(os.path.join(run, d)) for d in sorted(os.listdir(run))
                if os.path.exists(os.path.join(run, d, "metrics.json"))]
    compiles.sort(key=lambda c: (c["id"] if c["id"] is not None else 1 << 30, c["folder"]))
    prof_path = os.path.join(run, "profile.json")
    prof = json.loads(_read(prof_path, 50_000_000)) if os.path.exists(prof_path) else None
    eager_path = os.path.join(run, "eager_runs.json")  # kiln/eager_runs.py writes it
    eager = json.loads(_read(eager_path)) if os.path.exists(eager_path) else []
    return {"dir": run, "compiles": compiles, "profile": prof, "eager_runs": eager}


def sync_kind(reason: str) -> str | None:
    for pattern, kind in SYNC_BREAKS:
        if pattern.search(reason or ""):
            return kind
    return None


def host_syncs(run: dict) -> list[dict]:
    """One row per source line where the program read a tensor's value on the host: the graph
    breaks whose reason is such a read (each compile that broke there is listed: a recompile
    breaks again at the same line), joined by file:line with the reads the profiler run
    observed (which also finds those in code kiln never compiled). With a profile, a break
    whose reason could be a read but where none was observed (``print("done")``) is left out."""
    prof = run["profile"]
    observed = {(s["filename"], s["lineno"]): s for s in (prof or {}).get("syncs", [])}
    rows, by_line = [], {}
    for c in run["compiles"]:
        for b in c["breaks"]:
            kind = sync_kind(b["reason"])
            key = (b["filename"], b["lineno"])
            if not kind or (prof is not None and key not in observed):
                continue
            row = by_line.get(key)
            if row is None:
                row = by_line[key] = {"filename": b["filename"], "lineno": b["lineno"],
                                      "source": b.get("source_line"), "what": kind, "breaks": [],
                                      "count": None}
                rows.append(row)
            row["breaks"].append((c, b))
    for key, s in observed.items():
        row = by_line.get(key)
        if row is None:
            row = by_line[key] = {"filename": s["filename"], "lineno": s["lineno"], "source": None,
                                  "what": s["what"], "breaks": [], "count": None}
            rows.append(row)
        row["count"] = (row["count"] or 0) + s["count"]
    return rows


def resumed_in(run: dict, c: dict, event: dict) -> list[dict]:
    """The compiles of the resume functions a graph break of compile ``c`` handed over to."""
    out = []
    for name in event.get("resume", []):
        later = [d for d in run["compiles"] if d["name"] == name and (d["id"] or 0) > (c["id"] or 0)]
        if later:
            out.append(later[0])
    return out


# ------------------------------------------------------------------ rendering
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1f2a37;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .sub{color:#b8c2cc;font-size:12px}main{padding:8px 24px 40px;max-width:1400px}
h2{border-bottom:2px solid #d5dae0;padding-bottom:4px;margin-top:28px}
.card{background:#fff;border:1px solid #d5dae0;border-radius:6px;padding:10px 14px;margin:10px 0}
.summary span{display:inline-block;margin-right:18px}.summary b{font-size:18px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #dde1e6;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#eef1f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre,code{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}pre{background:#f3f5f7;padding:8px;
overflow:auto;max-height:480px;margin:4px 0;border-radius:4px}.from{background:#fff4c2;display:block}
.break{border-left:4px solid #d64545}.recompile{border-left:4px solid #e8a33d}
.tag{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;margin:0 3px;color:#fff}
.t-break{background:#d64545}.t-recompile{background:#e8a33d}.t-kernel{background:#3d7ae8}
.t-sync{background:#8e44ad}details{margin:3px 0}summary{cursor:pointer;font-weight:600}
.srcline{font:12px/1.5 ui-monospace,Menlo,monospace;white-space:pre;display:flex}
.srcline .ln{color:#8795a1;width:48px;text-align:right;padding-right:10px;flex:none}
.srcline.hot{background:#eef4ff}.srcline a.tag{font-family:system-ui}
:target{outline:3px solid #f0b429;background:#fff8db !important}
.lane{position:relative;height:22px;background:#f3f5f7;margin:2px 0 2px 90px;border-radius:3px}
.lane .label{position:absolute;left:-90px;width:84px;text-align:right;font-size:12px;top:3px}
.bar{position:absolute;top:2px;height:18px;min-width:2px;border-radius:2px;opacity:.85;display:block}
.l-run{background:#9aa5b1}.l-call{background:#5b6b7a}.l-graph{background:#2e7d5b}.l-kernel{background:#3d7ae8}
.l-torchop{background:#e8a33d}.l-sync{background:#8e44ad}.l-device{background:#d64545}
.muted{color:#6b7785}button{margin-right:6px}
"""

JS = """
function setAll(open){document.querySelectorAll('details').forEach(d=>d.open=open);}
window.addEventListener('hashchange',()=>{const t=document.getElementById(location.hash.slice(1));
 if(!t)return;let p=t.parentElement;while(p){if(p.tagName==='DETAILS')p.open=true;p=p.parentElement;}
 t.scrollIntoView({block:'center'});});
"""


def esc(x) -> str:
    return html.escape("" if x is None else str(x))


def _us(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if us >= 1000 else f"{us:.1f} µs"


class Page:
    """Builds the page; keeps the source-line index that links kernels, breaks and syncs."""

    def __init__(self, run: dict):
        self.run = run
        self.files: dict = {}  # filename -> index
        self.lines: dict = {}  # (filename, lineno) -> {"text": str, "tags": [html]}
        self.timing = {(k["folder"], k["kernel"]): k for k in (run["profile"] or {}).get("kernels", [])}

    def line_ref(self, filename, lineno, text=None, tag=None) -> str:
        """Register a source line (with a back-link tag) and return a link to it."""
        if not filename or not lineno:
            return ""
        fi = self.files.setdefault(filename, len(self.files))
        entry = self.lines.setdefault((filename, lineno), {"text": text, "tags": []})
        entry["text"] = entry["text"] or text
        if tag and tag not in entry["tags"]:
            entry["tags"].append(tag)
        return f'<a href="#L-{fi}-{lineno}">{esc(os.path.basename(filename))}:{lineno}</a>'

    def render(self) -> str:
        run = self.run
        head = [self.summary(), self.eager(), self.syncs(), self.timeline()]
        compiles = [self.compile_section(c) for c in run["compiles"]]
        body = head + [self.sources()] + compiles  # sources last: the others fill its line index
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kiln report</title>"
                f"<style>{CSS}</style></head><body><header><h1>kiln report</h1>"
                f"<div class='sub'>{esc(run['dir'])}</div></header><main>"
                f"<div><button onclick='setAll(true)'>expand all</button>"
                f"<button onclick='setAll(false)'>collapse all</button></div>"
                + "".join(body) + f"</main><script>{JS}</script></body></html>")

    def summary(self) -> str:
        cs = self.run["compiles"]
        graphs = sum(1 for c in cs if "02_captured_graph.py" in c["files"])
        n = {"compiles": len(cs), "graphs": graphs, "graph breaks": sum(len(c["breaks"]) for c in cs),
             "recompiles": sum(len(c["recompiles"]) for c in cs),
             "kernels": sum(len(c["kernels"]) for c in cs), "host syncs": len(host_syncs(self.run)),
             "eager frames": len(self.run.get("eager_runs", []))}
        items = "".join(f"<span><b>{v}</b> {k}</span>" for k, v in n.items())
        prof = self.run["profile"]
        note = (f"<div class='muted'>profile: {esc(prof['program'])}, {prof['runs']} run(s) on "
                f"{esc(prof['device'])}; {esc(prof['timing'])}</div>" if prof else
                "<div class='muted'>no profile.json: run <code>python -m kiln report --profile "
                "script.py</code> for times, bandwidth and the runtime sync list</div>")
        toc = " · ".join(f"<a href='#c-{esc(c['folder'])}'>{esc(c['folder'])}</a>" for c in cs)
        return f"<div class='card summary'>{items}{note}<div>compiles: {toc}</div></div>"

    def eager(self) -> str:
        """Frames that ran natively instead of compiled (kiln/eager_runs.py), with the reason."""
        rows = self.run.get("eager_runs", [])
        if not rows:
            return ""
        out = ["<h2 id='eager'>Eager runs</h2><div class='card'><p class='muted'>Frames (or the "
               "rest of a frame after a graph break) that ran as plain Python and torch, "
               "uncompiled; counted as of the first run of each.</p><table class='synclist'>"
               "<tr><th>line</th><th>function</th><th>source</th><th>why</th></tr>"]
        for r in rows:
            tag = "<a class='tag t-break' href='#eager'>eager</a>"
            link = self.line_ref(r.get("filename"), r.get("lineno"), r.get("source_line"), tag) or "?"
            out.append(f"<tr><td>{link}</td><td>{esc(r.get('name'))}</td><td><code>"
                       f"{esc((r.get('source_line') or '').strip())}</code></td>"
                       f"<td>{esc(r.get('reason'))}</td></tr>")
        out.append("</table></div>")
        return "".join(out)

    def syncs(self) -> str:
        rows = host_syncs(self.run)
        out = ["<h2 id='syncs'>Host synchronizations</h2><div class='card'>",
               "<p class='muted'>Every point where the program made the host wait for a tensor's "
               "value. Each one is a graph break when it happens inside a compiled function.</p>"]
        if not rows:
            out.append("<p>none found</p></div>")
            return "".join(out)
        out.append("<table class='synclist'><tr><th>line</th><th>source</th><th>what</th>"
                   "<th>graph break it caused</th><th>times observed</th></tr>")
        for i, r in enumerate(rows):
            tag = f'<a class="tag t-sync" href="#sync-{i}">sync</a>'
            link = self.line_ref(r["filename"], r["lineno"], r["source"], tag)
            src = r["source"] or linecache.getline(r["filename"] or "", r["lineno"] or 0)
            if r["breaks"]:
                brk = "<br>".join(f"<a href='#c-{esc(c['folder'])}'>compile {c['id']} ({esc(c['name'])})</a>: "
                                  f"{esc(b['reason'])}" for c, b in r["breaks"])
            else:
                brk = "<span class='muted'>none (not in compiled code)</span>"
            count = "—" if r["count"] is None else r["count"]
            out.append(f"<tr id='sync-{i}'><td>{link}</td><td><code class='src-{i}'>{esc(src.strip())}"
                       f"</code></td><td>{esc(r['what'])}</td><td>{brk}</td><td class='num'>{count}</td></tr>")
        out.append("</table></div>")
        return "".join(out)

    def timeline(self) -> str:
        prof = self.run["profile"]
        if not prof:
            return ""
        events = prof.get("timeline", [])
        out = ["<h2 id='timeline'>Timeline</h2><div class='card'>"]
        if events:
            total = max(e["start_us"] + e["dur_us"] for e in events) or 1.0
            out.append(f"<div class='muted'>0 … {_us(total)} (hover a bar for its name and time; "
                       f"click a kernel to see it)</div>")
            for lane in LANES:
                bars = []
                for e in events:
                    if e["lane"] != lane:
                        continue
                    left, width = 100 * e["start_us"] / total, 100 * e["dur_us"] / total
                    href = ""
                    if lane == "kernel":
                        folder, kernel = e["name"].split(" ", 2)[2].split("/", 1)
                        href = f" href='#k-{esc(folder)}-{esc(kernel)}'"
                    elif lane == "device" and e["name"].startswith("kiln device "):
                        folder, kernel = e["name"].split(" ", 2)[2].split("/", 1)
                        href = f" href='#k-{esc(folder)}-{esc(kernel)}'"
                    elif lane == "graph":
                        href = f" href='#c-{esc(e['name'].split(' ', 2)[2])}'"
                    bars.append(f"<a class='bar l-{lane.replace(' ', '')}'{href} style='left:{left:.3f}%;"
                                f"width:{width:.3f}%' title='{esc(e['name'])} {_us(e['dur_us'])}'></a>")
                if bars:
                    out.append(f"<div class='lane'><span class='label'>{lane}</span>{''.join(bars)}</div>")
        out.append(self.kernel_table())
        out.append("</div>")
        return "".join(out)

    def kernel_table(self) -> str:
        rows = ["<table class='kerneltimes'><tr><th>kernel</th><th>calls</th><th>median</th><th>min</th>"
                "<th>bytes moved</th><th>bandwidth</th><th>source lines</th><th>timed on</th></tr>"]
        for c in self.run["compiles"]:
            for k in c["kernels"]:
                t = self.timing.get((c["folder"], k["name"]))
                lines = ", ".join(sorted({f"{os.path.basename(o['filename'])}:{o['lineno']}"
                                          for o in k["origins"] if o["filename"]}))
                rows.append(f"<tr><td><a href='#k-{esc(c['folder'])}-{esc(k['name'])}'>{esc(c['folder'])}/"
                            f"{esc(k['name'])}</a></td>" + self.timing_cells(k, t) +
                            f"<td>{esc(lines)}</td><td class='muted'>{esc((t or {}).get('source', '—'))}</td></tr>")
        return "".join(rows) + "</table>"

    @staticmethod
    def timing_cells(k, t) -> str:
        nbytes = k["bytes"]
        size = "?" if nbytes is None else f"{nbytes / 1e6:.3f} MB"
        if not t:
            return f"<td class='num'>—</td><td class='num'>—</td><td class='num'>—</td><td class='num'>{size}</td><td>—</td>"
        med = t.get("median_us", t["mean_us"])
        bw = "?" if not nbytes or not med else f"{nbytes / (med * 1e-6) / 1e9:.2f} GB/s"
        return (f"<td class='num'>{t['calls']}</td><td class='num'>{_us(med)}</td>"
                f"<td class='num'>{_us(t['min_us'])}</td><td class='num'>{size}</td><td class='num'>{bw}</td>")

    def compile_section(self, c: dict) -> str:
        fid = esc(c["folder"])
        tags = "".join(f"<span class='tag t-break'>graph break</span>" for _ in c["breaks"])
        tags += "".join(f"<span class='tag t-recompile'>recompile</span>" for _ in c["recompiles"])
        out = [f"<h2 id='c-{fid}'>compile {c['id']}: {esc(c['name'])} {tags}</h2>"]
        if c["kind"] == "backward":
            fw = next((d for d in self.run["compiles"] if d["id"] == c["backward_of"]), None)
            link = f"<a href='#c-{esc(fw['folder'])}'>compile {fw['id']} ({esc(fw['name'])})</a>" if fw else "?"
            out.append(f"<div class='muted'>the backward of {link}, compiled at its first backward()</div>")
        elif c["kind"] == "resume":
            out.append("<div class='muted'>a resume function: the rest of a function after a graph break</div>")
        for i, b in enumerate(c["breaks"]):
            tag = f'<a class="tag t-break" href="#c-{fid}">break: compile {c["id"]}</a>'
            link = self.line_ref(b["filename"], b["lineno"], b.get("source_line"), tag)
            out.append(f"<div class='card break'><b>graph break</b>: {esc(b['reason'])}<br>at {link or '?'}: "
                       f"<code>{esc((b.get('source_line') or '').strip())}</code><div class='muted'>"
                       f"{self.after_break(c, b)}</div></div>")
        for e in c["recompiles"]:
            out.append(f"<div class='card recompile'><b>recompile</b> of {esc(c['name'])}: "
                       f"<code>{esc(e['reason'])}</code></div>")
        secs = c["metrics"].get("stage_seconds", {})
        if secs:
            cells = "".join(f"<th>{s}</th>" for s in STAGES if s in secs)
            vals = "".join(f"<td class='num'>{secs[s] * 1e3:.2f} ms</td>" for s in STAGES if s in secs)
            out.append(f"<table class='stagetimes'><tr><th>stage</th>{cells}</tr><tr><td>time</td>{vals}</tr></table>")
        for k in c["kernels"]:
            out.append(self.kernel_card(c, k))
        out.append("<div class='card'><b>artifacts, in pipeline order</b>")
        for f in c["files"]:
            stage = next((s for p, s in STAGE_OF_FILE if f.startswith(p)), "")
            out.append(f"<details><summary>{esc(f)} <span class='muted'>{esc(stage)}</span></summary>"
                       f"<pre>{esc(c['texts'][f])}</pre></details>")
        out.append("</div>")
        return "".join(out)

    def after_break(self, c: dict, b: dict) -> str:
        """What ran after the break: the resume function's compile, or why it ran eagerly."""
        event = next((e for e in c["break_events"] if e.get("lineno") in (b["lineno"], None)), None)
        if event is None:
            return "what ran after it was not recorded"
        if event.get("eager_reason"):
            return f"the function runs eagerly: {esc(event['eager_reason'])}"
        if event.get("eager_rest"):
            return ("the graph up to here ran compiled; the rest of the function (from the loop "
                    "holding the break) runs eagerly")
        later = resumed_in(self.run, c, event)
        links = ", ".join(f"<a href='#c-{esc(d['folder'])}'>compile {d['id']} ({esc(d['name'])})</a>"
                          for d in later) or esc(", ".join(event.get("resume", [])))
        return f"the graph up to here ran compiled; the breaking line ran eagerly; the rest resumed in {links}"

    def kernel_card(self, c: dict, k: dict) -> str:
        kid = f"k-{esc(c['folder'])}-{esc(k['name'])}"
        tag = f'<a class="tag t-kernel" href="#{kid}">{esc(c["folder"])}/{esc(k["name"])}</a>'
        origins = []
        for o in k["origins"]:
            link = self.line_ref(o["filename"], o["lineno"], o["source"], tag)
            origins.append(f"<tr><td><code>{esc(o['node'])}</code></td><td>{link}</td>"
                           f"<td><code class='pysrc'>{esc(o['source'])}</code></td></tr>")
        src = "\n".join(f"<span class='from'>{esc(line)}</span>" if ORIGIN_RE.match(line) else esc(line)
                        for line in k["source"].splitlines())
        t = self.timing.get((c["folder"], k["name"]))
        perf = ("<table><tr><th>calls</th><th>median</th><th>min</th><th>bytes moved</th><th>bandwidth</th></tr>"
                f"<tr>{self.timing_cells(k, t)}</tr></table>")
        return (f"<div class='card kernel' id='{kid}'><b>kernel {esc(k['name'])}</b> "
                f"<span class='muted'>({esc(k['lang'])}, {esc(k['file'])})</span>{perf}"
                f"<table class='origins'><tr><th>node</th><th>line</th><th>Python source</th></tr>"
                f"{''.join(origins) or '<tr><td colspan=3>no from: lines</td></tr>'}</table>"
                f"<details open><summary>source</summary><pre>{src}</pre></details></div>")

    def sources(self) -> str:
        if not self.lines:
            return ""
        out = ["<h2 id='sources'>Python source lines</h2><p class='muted'>Each line the kernels, "
               "graph breaks and syncs came from, with links to them.</p>"]
        for filename, fi in self.files.items():
            wanted = sorted(ln for (f, ln) in self.lines if f == filename)
            try:
                with open(filename, errors="replace") as f:
                    text = f.read().splitlines()
            except OSError:
                text = None
            show = sorted({n for ln in wanted for n in range(ln - 2, ln + 3)
                           if text is not None and 1 <= n <= len(text)} | set(wanted))
            out.append(f"<div class='card'><b>{esc(filename)}</b>")
            prev = None
            for n in show:
                if prev is not None and n > prev + 1:
                    out.append("<div class='srcline muted'><span class='ln'>…</span></div>")
                entry = self.lines.get((filename, n))
                code = text[n - 1] if text is not None and n <= len(text) else (entry or {}).get("text") or ""
                tags = " ".join(entry["tags"]) if entry else ""
                hot = " hot" if entry else ""
                out.append(f"<div class='srcline{hot}' id='L-{fi}-{n}'><span class='ln'>{n}</span>"
                           f"<span>{esc(code)}</span>&nbsp;&nbsp;{tags}</div>")
                prev = n
            out.append("</div>")
        return "".join(out)


def render(path: str) -> str:
    return Page(load_run(path)).render()


def write_report(path: str, out: str | None = None) -> str:
    """The page (``out``, by default ``report.html`` in the run folder); with a profile, also
    its Chrome/Perfetto trace beside it (kiln.observe.trace). Returns the page's path."""
    return write_files(path, out)[0]


def write_files(path: str, out: str | None = None, trace_out: str | None = None):
    """(page, trace or None): the trace is written when the run folder holds a profile."""
    run = find_run(path)
    out = out or os.path.join(run, "report.html")
    data = load_run(run)
    with open(out, "w") as f:
        f.write(Page(data).render())
    if not data["profile"]:
        return out, None
    return out, write_trace(data["profile"], trace_out or trace_path(out))


USAGE = """usage: python -m kiln report DIR [-o OUT.html] [--trace OUT.json]
       python -m kiln report [-o OUT.html] [--trace OUT.json] --profile SCRIPT.py [ARGS...]

DIR is a KILN_DEBUG run folder (kiln_debug/run_*) or its parent (the newest run is taken).
--profile runs SCRIPT under torch.profiler with KILN_DEBUG on, then reports that run.
With a profile, a Chrome/Perfetto trace (traceEvents JSON) is written beside the page:
trace.json next to report.html, NAME.trace.json next to NAME.html (ui.perfetto.dev loads it)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln report", usage=USAGE.split("\n\n")[0].replace("usage: ", ""),
                                description=USAGE.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="a KILN_DEBUG run folder, or its parent")
    p.add_argument("-o", "--output", metavar="OUT.html", help="where the page goes (default: DIR/report.html)")
    p.add_argument("--trace", metavar="OUT.json", help="where the Perfetto trace goes")
    p.add_argument("--profile", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS...]",
                   help="run SCRIPT (with ARGS) under the profiler first, then report that run")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.profile is not None:
        if not args.profile:
            p.error("--profile needs a script")
        if args.dir is not None:
            p.error("give DIR or --profile SCRIPT.py, not both")
        script, script_args = args.profile[0], args.profile[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        target = profile_script(script, script_args)
    elif args.dir is not None:
        target = args.dir
    else:
        p.error("give a run folder (DIR) or --profile SCRIPT.py")
    try:
        page, trace = write_files(target, args.output, args.trace)
    except FileNotFoundError as e:
        print(f"kiln report: {e}", file=sys.stderr)
        return 2
    print(f"kiln report: {page}", file=sys.stderr)
    if trace:
        print(f"kiln report: trace {trace} (open in ui.perfetto.dev)", file=sys.stderr)
    return 0
