"""The benchmark runner, in-process on the CPU with --quick: every line carries the fields the
suite promises, kiln is correct, and the ratios are positive numbers. No timing thresholds."""
import json
import math
import sys
from pathlib import Path

import pytest

# The suite lives at the repository root (benchmarks/), outside the installed kiln package.
# With tests/ on sys.path, tests/benchmarks/ would shadow it as a namespace package.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

from benchmarks import run  # noqa: E402

REQUIRED = ("case", "device", "shape", "dtype", "torch_version", "triton_version",
            "python_version", "eager_s", "kiln_s", "kiln_vs_eager", "kiln_vs_torch_compile",
            "kiln_cold_compile_s", "kiln_warm_disk_compile_s", "correct")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out.jsonl"
    recs = run.main(["--device", "cpu", "--quick", "--cases", "seed,overhead",
                     "--no-torch-compile", "--out", str(out)])
    return recs, out


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def test_one_line_per_setup_and_file_matches(records):
    recs, out = records
    assert [r["case"] for r in recs] == ["seed", "overhead"]
    lines = out.read_text().splitlines()
    assert [json.loads(line) for line in lines] == recs


def test_required_fields_and_correctness(records):
    for r in records[0]:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, (r["case"], missing)
        assert "kiln_error" not in r, r.get("kiln_error")
        assert r["correct"] is True, r.get("mismatch")
        assert r["device"] and r["dtype"] == "float32"
        for k in ("eager_s", "kiln_s", "kiln_vs_eager", "kiln_cold_compile_s",
                  "kiln_warm_disk_compile_s"):
            assert _positive(r[k]), (r["case"], k, r[k])
        # torch.compile was skipped: its ratio is absent (None), with the reason recorded.
        assert r["kiln_vs_torch_compile"] is None
        assert r["torch_compile_error"].startswith("skipped")


def test_overhead_reports_microseconds(records):
    (ov,) = [r for r in records[0] if r["case"] == "overhead"]
    assert ov["shape"] == [8]
    assert _positive(ov["eager_us"]) and _positive(ov["kiln_us"])


def test_warm_disk_call_loads_from_disk(records):
    # After kiln.reset() the first call should load kernels from the populated cache dir,
    # not build them again.
    for r in records[0]:
        assert r["kiln_warm_disk_builds"] == 0, r


def test_derive_ratios_with_torch_compile():
    from benchmarks.cases import CASES
    setup = CASES["seed"]("cpu", True)[0]
    rec = {"eager_s": 2.0, "torch_compile_s": 1.0, "kiln_s": 0.5, "bytes_moved": 100}
    run.derive(rec, setup, "cpu")
    assert rec["kiln_vs_eager"] == 4.0 and rec["kiln_vs_torch_compile"] == 2.0
    assert rec["torch_compile_vs_eager"] == 2.0


def test_unknown_case_is_an_error():
    with pytest.raises(SystemExit):
        run.main(["--device", "cpu", "--cases", "nope"])
