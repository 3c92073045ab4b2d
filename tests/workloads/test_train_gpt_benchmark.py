"""benchmarks/train_gpt.py on the CPU at its tiny config (kiln against eager; torch.compile is
skipped here for time): one JSON line per compiler with tokens/s and the losses, and kiln's loss
curve agrees with eager's. The GPT-2-small run (bf16, 8 x 1024) is for the GPU machine."""
import json
import sys
from pathlib import Path

import torch

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("benchmarks"), "__file__", "") is None:
    del sys.modules["benchmarks"]  # tests/benchmarks as a namespace package would shadow it

from benchmarks import train_gpt  # noqa: E402


def test_train_gpt_benchmark_tiny_cpu(tmp_path):
    out = tmp_path / "train.jsonl"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        status = train_gpt.main(["--device", "cpu", "--config", "tiny", "--steps", "5", "--no-torch-compile",
                                 "--out", str(out)])
    finally:
        torch.set_num_threads(n)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["compiler"] for r in records] == ["eager", "kiln"]
    for r in records:
        assert len(r["losses"]) == 5 and r["tokens_per_s"] > 0 and r["step_s"] > 0
        assert r["batch"] == 4 and r["seq"] == 32 and r["dtype"] == "torch.float32"
        assert r["losses_match"], r
    kiln = records[1]
    assert kiln["kiln_stats"]["kernels_generated"] + kiln["kiln_stats"].get("graph_cache_hits", 0) > 0
    assert kiln["kiln_stats"]["fallbacks"] == 0
    assert status == 0


def test_losses_agree_flags_a_drift():
    ok, worst = train_gpt.losses_agree([4.0, 3.5, 3.0], [4.0, 3.5, 3.2], torch.float32)
    assert not ok and abs(worst - 0.2) < 1e-9
    assert train_gpt.losses_agree([4.0, 3.5], [4.0, 3.52], torch.bfloat16)[0]


def test_gpt2_config_is_gpt2_small():
    cfg, batch = train_gpt.CONFIGS["gpt2"]
    assert (cfg.layers, cfg.heads, cfg.dim, cfg.seq, batch) == (12, 12, 768, 1024, 8)
