"""benchmarks.env_ab: each variant of kiln settings runs the benchmark in its own process and
every case gets a kiln time per variant (CPU, --quick; no timing thresholds)."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]

import pytest  # noqa: E402

from benchmarks import env_ab  # noqa: E402


def test_each_variant_times_each_case():
    out = env_ab.main(["--device", "cpu", "--quick", "--cases", "seed",
                       "--var", "cpp_tile_2d=1", "--var", "cpp_tile_2d=0 triton_looped_rblock=512"])
    assert not out["wrong"], out["wrong"]
    assert out["times"]
    for per in out["times"].values():
        assert sorted(per) == [0, 1]
        assert all(t > 0 for ts in per.values() for t in ts)


def test_a_variant_is_kiln_settings_only():
    env = env_ab.parse_variant("triton_tile_2d=0 triton_looped_rblock=4096 KILN_STRICT=1")
    assert env["KILN_STRICT"] == "1" and env["KILN_CONFIG"].endswith("triton_tile_2d=0,triton_looped_rblock=4096")
    with pytest.raises(SystemExit):
        env_ab.parse_variant("PATH=/tmp")
    with pytest.raises(SystemExit, match="triton_tile_2d=0"):  # a retired variable names its setting
        env_ab.parse_variant("KILN_TILE_2D=0")
