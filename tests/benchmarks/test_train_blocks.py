"""benchmarks.train_blocks: each compiler's gradients are checked against eager's before it is
timed, and the row carries kiln's ratios."""
import torch

from benchmarks import train_blocks


def test_conv_bn_relu_row_checks_gradients_then_times():
    row = train_blocks.run_case("conv_bn_relu", "cpu", torch.float32, with_tc=False)
    assert row["kiln_correct"] is True
    assert row["eager_ms"] > 0 and row["kiln_ms"] > 0 and row["kiln_vs_eager"] > 0


def test_a_wrong_step_is_reported_not_timed(monkeypatch):
    monkeypatch.setattr(train_blocks.kiln, "compile", lambda m: (lambda *a: m(*a) * 1.5))
    row = train_blocks.run_case("conv_bn_relu", "cpu", torch.float32, with_tc=False)
    assert row["kiln_correct"] is False and "kiln_ms" not in row and "kiln_vs_eager" not in row
