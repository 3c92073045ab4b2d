"""Online softmax (triton_reduction.plan_online): in a looped reduction kernel, the pass of
max(x) and the pass of sum(exp(x - max)) run as one pass with running-max rescaling."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn

LOOPED = dict(triton_max_persistent_rblock=8, triton_looped_rblock=8)

FNS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.arange(x.shape[0], device=x.device) % x.shape[1]),
}
PASSES = {"softmax": 2, "log_softmax": 2, "logsumexp": 1, "cross_entropy": 1}  # looped passes over x


def _special(x):
    x = x.clone()
    x[0, 3] = float("-inf")
    x[1, :9] = float("-inf")       # a row that starts with -inf in every lane
    x[2, 5] = float("inf")
    x[3, 7] = float("nan")
    x[4, :] = float("-inf")        # a row of -inf only
    x[5, 20] = float("inf")        # +inf after finite values, then -inf and a large value
    x[5, 30] = float("-inf")
    x[5, 2] = 80.0
    x[6, 1::4] = float("inf")      # +inf in several lanes
    x[7, 10] = float("nan")        # nan late in a row, after a +inf
    x[7, 3] = float("inf")
    x[8, :20] = float("-inf")      # -inf then +inf then finite values
    x[8, 20] = float("inf")
    x[9, 0] = 1e4                  # a max far above the rest: exp(x - max) underflows
    x[9, 36] = -1e4
    return x


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("values", ["normal", "special"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(FNS))
def test_online_softmax_matches_eager(name, dtype, values, target):
    if name == "cross_entropy" and dtype != torch.float32:
        pytest.skip("cross_entropy takes float32 logits here")
    fn = FNS[name]
    with on_target(target) as device, kiln.config.patch(**LOOPED):
        x = randn((10, 37), torch.float32, device) * 3
        if values == "special":
            x = _special(x)
        x = x.to(dtype)
        assert_close(kiln.compile(fn)(x), fn(x), dtype=dtype)


@pytest.mark.parametrize("name", list(FNS))
def test_online_softmax_reads_input_once_fewer(name):
    pytest.importorskip("triton")
    import os
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter")
    fn = FNS[name]
    x = torch.randn(4, 64)
    with kiln.config.patch(cpu_backend="triton", **LOOPED):
        merged = kiln.explain(fn)(x)
        with kiln.config.patch(triton_online_softmax=False):
            plain = kiln.explain(fn)(x)
    loops = sum(k.source.count("for roffset") for k in merged.kernels)
    assert loops == PASSES[name]
    assert sum(k.source.count("for roffset") for k in plain.kernels) == loops + 1
    assert_close(merged.result, fn(x))

