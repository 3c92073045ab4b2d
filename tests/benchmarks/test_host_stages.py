"""benchmarks.host_stages: the GPT-2 graph's host stages through the Triton code generator, in a
child process, one row per phase and variant (a 1-layer model; no timing thresholds)."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

import pytest  # noqa: E402

from benchmarks import host_stages  # noqa: E402


def test_rows_carry_every_host_stage_per_variant():
    pytest.importorskip("triton")
    rows = host_stages.main(["--layers", "1", "--repeats", "1", "--phases", "inference,train",
                             "--var", "", "--var", "compile_gc=on"])
    assert [(r["phase"], r["variant"]) for r in rows] == [
        ("inference", "default"), ("inference", "compile_gc=on"),
        ("train", "default"), ("train", "compile_gc=on")]
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["kernels"] > 0 and r["first_s"] > 0
        want = {"capture", "decomp", "lowering", "scheduling", "codegen"} | ({"autograd"} if r["phase"] == "train" else set())
        assert want <= set(r["stage_s"]) and all(r["stage_s"][s] > 0 for s in want)
