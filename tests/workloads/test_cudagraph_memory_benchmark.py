"""benchmarks/cudagraph_memory.py on the CPU: the staged program runs under kiln (each stage its
own compiled function; reduce-overhead is refused on the CPU and runs normally) and matches
eager. On CUDA the same rows measure the pool policies (``config.cudagraph_share``)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from benchmarks import cudagraph_memory  # noqa: E402


@pytest.mark.parametrize("row", ["eager", "kiln share=auto"])
def test_staged_program_matches_eager_on_cpu(row):
    r = cudagraph_memory._child(row, "cpu", batch=1, seq=16, layers=2, stages=2)
    assert r["row"] == row and r["forward_s"] > 0
    assert r["max_abs_diff"] <= 1e-4
    if row.startswith("kiln"):
        assert r["kiln_stats"]["graph_breaks"] == 0 and r["kiln_stats"]["frames_compiled"] == 3
