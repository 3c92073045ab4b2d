"""benchmarks/zoo_ab.py: variants interleaved round by round, the median of kiln_vs_eager per
model and variant, and a variant whose kiln is wrong stops the A/B (its time is no result).
The zoo processes are replaced by a stub here (a real run takes minutes)."""
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

from benchmarks import zoo_ab  # noqa: E402


def test_interleaved_medians(monkeypatch, capsys):
    calls = []
    speed = {"": [1.0, 1.2, 1.1], "cpp_row_split=0": [2.0, 2.4, 2.2]}

    def run_once(tree, settings, args):
        calls.append(settings)
        k = sum(1 for c in calls if c == settings) - 1
        return [{"model": "gpt2", "mode": "inference", "kiln_pass": True, "kiln_vs_eager": speed[settings][k]}]
    monkeypatch.setattr(zoo_ab, "run_once", run_once)
    summary = zoo_ab.main(["--models", "gpt2", "--mode", "inference", "--var", "", "--var", "cpp_row_split=0",
                           "--rounds", "3"])
    assert calls == ["", "cpp_row_split=0"] * 3  # interleaved
    assert summary[("gpt2", "inference")] == [1.1, 2.2]
    assert "| gpt2 | inference | 1.100x" in capsys.readouterr().out


def test_needs_two_variants():
    with pytest.raises(SystemExit):
        zoo_ab.main(["--models", "gpt2", "--var", ""])


def test_a_wrong_variant_stops_the_ab(monkeypatch):
    class Done:
        returncode = 0
        stdout = '{"model": "gpt2", "mode": "inference", "kiln_pass": false, "kiln_vs_eager": 9.0}\n'
        stderr = ""
    monkeypatch.setattr(zoo_ab.subprocess, "run", lambda *a, **k: Done())
    args = zoo_ab.argparse.Namespace(models="gpt2", mode="inference", inner_rounds=1, threads=1, quick=True)
    with pytest.raises(SystemExit, match="kiln wrong or failed"):
        zoo_ab.run_once(_ROOT, "", args)
