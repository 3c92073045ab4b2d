"""Graphs and graph breaks of every model family in ``tests/models``, kiln against Dynamo
(``torch._dynamo.explain``, the peer's own count), for inference and a training step, on this
machine's Python: issue 25's table.

    python -m benchmarks.break_table --out breaks.jsonl --md breaks.md
    python -m benchmarks.break_table --models llama,bert,tv_resnet50

The models are the tests' small configs with random weights (``tests/models/model_helpers.py``,
``test_decoders.py``; torchvision's and timm's from ``test_torchvision_timm.py`` where those
libraries load). Inference runs under ``no_grad`` in eval mode; training is the tests' loss of
every floating output in train mode. One JSON line per model and mode; a markdown table with
``--md``.

The two compilers count differently, so the table shows both of kiln's figures. kiln's graphs
are its compiles, including those of a resumed frame that holds no op (a wrapper's tail after a
break in its callee), and its breaks are break events: a break in a callee nested n frames deep
is met again by each enclosing frame as it resumes. Dynamo counts only graphs with ops, and its
``graph_break_count`` is that count minus one. "kiln graphs with ops" is the figure to set
beside Dynamo's graphs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

DECODERS = ["llama", "mistral", "qwen2", "gemma", "phi3", "gpt_neox", "gpt2", "gpt2-labels"]
ENCODERS = ["bert", "roberta", "distilbert", "albert", "electra"]
SEQ2SEQ = ["t5", "bart", "whisper"]
VISION = ["vit", "swin", "convnext", "clip", "resnet", "regnet", "mobilenet"]


def _library_names():
    import pytest
    try:
        import test_torchvision_timm as tvt
    except (Exception, pytest.skip.Exception):  # noqa: BLE001 - no torchvision here: no rows
        return []
    return list(tvt.NAMES)


def build(name):
    """(model, args, kwargs) as the tests build them."""
    if name.startswith(("tv_", "timm_")):
        import test_torchvision_timm as tvt
        return tvt._build(name)
    if name.split("-")[0] in DECODERS:
        import test_decoders as dec
        labels = name.endswith("-labels")
        args, kwargs = dec._inputs(labels)
        return dec._model(name.split("-")[0], 0.0), args, kwargs
    from model_helpers import build as build_family
    return build_family(name)


def dynamo_counts(model, args, kwargs, train):
    import torch._dynamo  # the peer's figure, read by this benchmark only

    from model_helpers import loss_of
    torch._dynamo.reset()
    fn = (lambda *a, **k: loss_of(model(*a, **k))) if train else model
    out = torch._dynamo.explain(fn)(*args, **kwargs)
    torch._dynamo.reset()
    return out.graph_count, out.graph_break_count


def row(name, train):
    from model_helpers import explain_of
    model, args, kwargs = build(name)
    model.train(train)
    with torch.set_grad_enabled(train):
        out = explain_of(model, args, kwargs, train=train)
        k_graphs, k_breaks = out.graph_count, out.graph_break_count
        reasons = [b.reason for b in out.break_reasons]
        k_op_graphs = sum(1 for n in out.ops_per_graph if n)
        model.train(train)
        d_graphs, d_breaks = dynamo_counts(model, args, kwargs, train)
    return {"model": name, "mode": "training" if train else "inference",
            "python": platform.python_version(), "torch": torch.__version__,
            "kiln_graphs": k_graphs, "kiln_breaks": k_breaks, "kiln_graphs_with_ops": k_op_graphs,
            "dynamo_graphs": d_graphs, "dynamo_breaks": d_breaks,
            "kiln_reasons": sorted(set(reasons))[:5]}


def markdown(rows) -> str:
    lines = ["| model | mode | kiln graphs / breaks | kiln graphs with ops | Dynamo graphs / breaks |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | error: {r['error'][:60]} | | |")
            continue
        more = r.get("kiln_graphs_with_ops", r["kiln_graphs"]) > r["dynamo_graphs"] \
            or (r["dynamo_breaks"] == 0 and r["kiln_breaks"] > 0)
        flag = " **more**" if more else ""
        lines.append(f"| {r['model']} | {r['mode']} | {r['kiln_graphs']} / {r['kiln_breaks']}{flag} "
                     f"| {r.get('kiln_graphs_with_ops', '')} | {r['dynamo_graphs']} / {r['dynamo_breaks']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma list (default: every family, and torchvision/timm where they load)")
    p.add_argument("--out", help="JSON lines file")
    p.add_argument("--md", help="markdown table file")
    a = p.parse_args(argv)
    names = a.models.split(",") if a.models else DECODERS + ENCODERS + SEQ2SEQ + VISION + _library_names()
    rows = []
    for name in names:
        for train in (False, True):
            try:
                r = row(name, train)
            except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end
                r = {"model": name, "mode": "training" if train else "inference",
                     "error": f"{type(e).__name__}: {e}"}
            rows.append(r)
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    table = markdown(rows)
    sys.stderr.write(table)
    if a.md:
        with open(a.md, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
