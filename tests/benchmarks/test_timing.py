"""benchmarks.timing.measure_many: the implementations of one case take their samples in turn,
and one that raises is dropped and reported without stopping the others."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

import pytest  # noqa: E402

from benchmarks import timing  # noqa: E402

PLAN = timing.TimingPlan(warmup_calls=2, warmup_s=0.0, sample_s=0.0, samples=5, rotate_bytes=0)


def test_samples_interleave():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("eager", "torch_compile", "kiln")}
    timings, errors = timing.measure_many(calls, [()], "cpu", PLAN)
    assert not errors and sorted(timings) == ["eager", "kiln", "torch_compile"]
    sampled = order[-15:]  # sample_s=0: one call per sample, 5 rounds of the three
    assert sampled == ["eager", "torch_compile", "kiln"] * 5
    assert all(t.samples == 5 and t.median_s >= 0 for t in timings.values())


def test_a_failing_implementation_is_dropped_and_reported():
    n = {"calls": 0}

    def flaky():
        n["calls"] += 1
        if n["calls"] > 3:  # past warm-up and calibration: fails while sampling
            raise RuntimeError("boom")
    timings, errors = timing.measure_many({"eager": lambda: None, "kiln": flaky}, [()], "cpu", PLAN)
    assert list(timings) == ["eager"] and timings["eager"].samples == 5
    assert isinstance(errors["kiln"], RuntimeError)


def test_measure_raises_what_its_call_raises():
    def bad():
        raise ValueError("no")
    with pytest.raises(ValueError):
        timing.measure(bad, [()], "cpu", PLAN)
