"""benchmarks.compile_time's A/B variants: kiln's children get each variant's environment,
round by round, torch.compile once per round; labels and rounds land in the rows. The children
are replaced by a recorder (what a child measures is the benchmark's business, not a test's)."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

from benchmarks import compile_time  # noqa: E402


def test_variants_interleave_and_label_rows(monkeypatch):
    calls = []

    def fake_spawn(backend, phase, device, cache, extra_env=None):
        calls.append((backend, phase, dict(extra_env or {})))
        return {"first_result_s": 1.0, "process_s": 2.0}
    monkeypatch.setattr(compile_time, "_spawn", fake_spawn)
    variants = {"default": {}, "compile_gc=on": {"KILN_CONFIG": "compile_gc=on"}}
    rows = list(compile_time.compile_rows("cpu", ["kiln", "torch.compile"], ("train",), variants, rounds=2))
    kiln_rows = [r for r in rows if r["backend"] == "kiln"]
    assert [(r["variant"], r["round"]) for r in kiln_rows] == [
        ("default", 0), ("compile_gc=on", 0), ("default", 1), ("compile_gc=on", 1)]
    assert sum(r["backend"] == "torch.compile" for r in rows) == 2 and all(
        "variant" not in r for r in rows if r["backend"] == "torch.compile")
    # one unmeasured prime child first, then cold and warm, each with the variant's
    # environment; torch.compile's children get none
    assert calls[0] == ("prime", "train", {})
    calls = calls[1:]
    assert calls[2:4] == [("kiln", "train", {"KILN_CONFIG": "compile_gc=on"})] * 2
    assert all(env == {} for b, _, env in calls if b == "torch.compile")


def test_spawn_puts_the_variant_in_the_child_environment(monkeypatch, tmp_path):
    seen = {}

    class Done:
        returncode, stdout, stderr = 0, '{"first_result_s": 0.5}\n', ""

    def fake_run(cmd, cwd, env, capture_output, text):
        seen.update(env)
        return Done()
    monkeypatch.setattr(compile_time.subprocess, "run", fake_run)
    res = compile_time._spawn("kiln", "inference", "cpu", str(tmp_path), {"KILN_CONFIG": "speculative_backward=1"})
    assert res["first_result_s"] == 0.5
    assert seen["KILN_CONFIG"] == "speculative_backward=1"
    assert seen["KILN_CACHE_DIR"].startswith(str(tmp_path))


def test_ratio_lines_set_each_kiln_row_against_torch_compile_of_its_round(monkeypatch):
    # (cold, warm) per child in spawn order: each round runs kiln's variants, then torch.compile
    times = iter([2.0, 0.5, 1.5, 0.4, 10.0, 2.0,   # round 0: default, KILN_X=1, torch.compile
                  3.0, 0.6, 2.4, 0.3, 12.0, 3.0])  # round 1

    def fake_spawn(backend, phase, device, cache, extra_env=None):
        if backend == "prime":
            return {}
        return {"first_result_s": next(times)}
    monkeypatch.setattr(compile_time, "_spawn", fake_spawn)
    variants = {"default": {}, "KILN_X=1": {"KILN_X": "1"}}
    rows = list(compile_time.compile_rows("cpu", ["kiln", "torch.compile"], ("train",), variants, rounds=2))
    lines = compile_time.ratio_lines(rows)
    assert len(lines) == 4
    # round 0: kiln 2.0 / 10.0 cold, 0.5 / 2.0 warm; the variant 1.5 / 10.0; round 1 against 12.0
    assert "cold  0.20x" in lines[0] and "warm  0.25x" in lines[0] and "[default]" in lines[0]
    assert "cold  0.15x" in lines[1] and "[KILN_X=1]" in lines[1]
    assert "cold  0.25x" in lines[2] and "cold  0.20x" in lines[3]


def test_ratio_lines_skip_per_call_overhead_rows():
    # the overhead rows that close a full run carry no phase; they are not compile rows
    rows = [{"case": "compile_time", "phase": "train", "backend": "kiln", "round": 0,
             "cold": {"first_result_s": 2.0}, "warm": {"first_result_s": 1.0}},
            {"case": "compile_time", "phase": "train", "backend": "torch.compile", "round": 0,
             "cold": {"first_result_s": 8.0}, "warm": {"first_result_s": 2.0}},
            {"case": "per_call_overhead", "device": "cuda", "variant": "kiln", "us_per_call": 21.0}]
    lines = compile_time.ratio_lines(rows)
    assert len(lines) == 1 and "cold  0.25x" in lines[0] and "warm  0.50x" in lines[0]
