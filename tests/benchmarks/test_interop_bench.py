"""benchmarks/interop.py on the CPU: tiny GPT-2 inference through eager, torch.compile with
kiln's backend and kiln.compile (inductor skipped: its CPU compile is slow here). Checks the
JSON fields, that both kiln paths pass against the fp32 reference, and the table; no timing
thresholds."""
import json
import math
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

from benchmarks import interop  # noqa: E402


def test_quick_gpt2_inference_row(tmp_path, capsys):
    out = tmp_path / "interop.jsonl"
    recs = interop.main(["--device", "cpu", "--quick", "--no-inductor", "--models", "gpt2",
                         "--mode", "inference", "--rounds", "1", "--out", str(out)])
    assert [(r["model"], r["mode"]) for r in recs] == [("gpt2", "inference")]
    rec = recs[0]
    assert json.loads(out.read_text().splitlines()[0]) == rec
    for impl in ("eager", "dynamo_kiln", "kiln"):
        assert f"{impl}_error" not in rec, rec
        assert rec[f"{impl}_pass"] is True, rec
        assert math.isfinite(rec[f"{impl}_s"]) and rec[f"{impl}_s"] > 0
    assert rec["dynamo_kiln_kernels"] > 0 and rec["kiln_kernels"] > 0
    assert rec["dynamo_kiln_vs_kiln"] > 0 and rec["dynamo_kiln_vs_inductor"] is None
    assert "inductor_s" not in rec
    table = capsys.readouterr().err
    assert "| gpt2 | inference |" in table and "vs inductor" in table
