"""The model zoo (benchmarks/zoo.py) on the CPU: tiny GPT-2 (--quick, no torch.compile)
through inference and a training step, in-process. Checks the JSON lines' fields, that kiln
passes against the fp32 reference, and the merged table; no timing thresholds."""
import json
import math
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

from benchmarks import zoo, zoo_models, zoo_table  # noqa: E402

FIELDS = ("model", "group", "mode", "device", "dtype", "torch_version", "kiln_commit", "input_shapes",
          "params", "eager_s", "kiln_s", "eager_spread_pct", "kiln_spread_pct", "kiln_vs_eager",
          "kiln_cold_s", "kiln_graph_breaks", "kiln_pass", "kiln_rel_err", "eager_rel_err", "tolerance",
          "kiln_peak_mem_bytes", "kiln_vs_torch_compile", "torch_compile_error")


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    out, table = d / "zoo.jsonl", d / "zoo.md"
    recs = zoo.main(["--device", "cpu", "--quick", "--models", "gpt2", "--mode", "both", "--rounds", "2",
                     "--no-torch-compile", "--out", str(out), "--table", str(table)])
    return recs, out, table


def test_rows_and_fields(run):
    recs, out, _ = run
    assert [(r["model"], r["mode"]) for r in recs] == [("gpt2", "inference"), ("gpt2", "training")]
    assert [json.loads(line) for line in out.read_text().splitlines()] == recs
    for r in recs:
        missing = [f for f in FIELDS if f not in r]
        assert not missing, missing
        assert "error" not in r and "kiln_error" not in r, r
        assert r["kiln_pass"] is True and r["kiln_rel_err"] <= r["tolerance"], r
        assert all(_positive(r[k]) for k in ("eager_s", "kiln_s", "kiln_vs_eager", "kiln_cold_s")), r
        assert r["kiln_graph_breaks"] == 0, r  # tiny GPT-2 compiles whole, both ways
        assert r["kiln_peak_mem_bytes"] is None and r["dtype"] == "float32"  # CPU
        assert r["torch_compile_error"].startswith("skipped")


def test_table_has_both_modes_and_geomeans(run):
    recs, _, table = run
    text = table.read_text()
    assert "### inference" in text and "### training" in text
    assert text.count("**geomean**") == 2
    assert text == zoo_table.markdown(recs) + "\n"


def test_time_budget_skips_and_table_merges(tmp_path):
    """A spent budget gives one skipped row per model and mode without building anything;
    the table tool merges files, the last row of a model and mode winning."""
    recs = zoo.main(["--device", "cpu", "--models", "hf", "--mode", "inference", "--time-budget", "0",
                     "--no-torch-compile", "--out", str(tmp_path / "a.jsonl")])
    assert [r["model"] for r in recs] == zoo_models.GROUPS["hf"]
    assert all("skipped" in r for r in recs)
    good = dict(recs[0], skipped=None, kiln_pass=True, kiln_s=1.0, eager_s=2.0, torch_compile_s=1.5,
                kiln_vs_eager=2.0, kiln_vs_torch_compile=1.5, torch_compile_vs_eager=4 / 3)
    del good["skipped"]
    (tmp_path / "b.jsonl").write_text(json.dumps(good) + "\n")
    text = zoo_table.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
    row = next(line for line in text.splitlines() if line.startswith(f"| {good['model']} |"))
    assert "1.50x" in row and "2.00x" in row
    geo = next(line for line in text.splitlines() if "**geomean**" in line)
    assert "1.50x" in geo and "1/" in geo


def test_model_lists():
    assert zoo_models.resolve("gpt2,hf")[0] == "gpt2"
    assert set(zoo_models.resolve("torchvision")) >= {"tv_resnet50", "tv_convnext_tiny", "tv_swin_t"}
    assert len(zoo_models.resolve("timm")) == 5
    with pytest.raises(KeyError):
        zoo_models.resolve("nope")
    text = zoo.list_models()
    assert "hf (installed)" in text and "tv_convnext_tiny" in text
