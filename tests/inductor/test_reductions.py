"""Reductions end to end: one table of reduction x dtype x layout x target against eager, the
looped code path, and fusion structure (softmax and normalization chains are one kernel)."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target, randn

FLOATS = (torch.float32, torch.float16, torch.bfloat16)

REDUCTIONS = {
    "sum_last": (lambda x: x.sum(-1), FLOATS + (torch.int32,)),
    "sum_first_keepdim": (lambda x: torch.sum(x, 0, keepdim=True), FLOATS),
    "sum_all": (lambda x: x.sum(), FLOATS),
    "sum_dtype": (lambda x: x.sum(1, dtype=torch.float32), (torch.float16,)),
    "mean": (lambda x: x.mean(-1, keepdim=True), FLOATS),
    "prod": (lambda x: (x * 0.5 + 1).prod(1), (torch.float32,)),
    "amax": (lambda x: x.amax(-1), FLOATS + (torch.int64,)),
    "amin_first": (lambda x: torch.amin(x, 0), FLOATS),
    "max_all": (lambda x: torch.max(x), (torch.float32,)),
    "max_dim": (lambda x: torch.max(x, 1), (torch.float32, torch.int32)),
    "min_dim_keepdim": (lambda x: x.min(0, keepdim=True), (torch.float32,)),
    "argmax": (lambda x: x.argmax(-1), (torch.float32, torch.int64)),
    "argmin_first": (lambda x: torch.argmin(x, 0), (torch.float32,)),
    "any": (lambda x: (x > 1).any(-1), (torch.float32,)),
    "all": (lambda x: (x > -2).all(), (torch.float32,)),
    "var": (lambda x: x.var(-1), FLOATS),
    "std_biased": (lambda x: torch.std(x, 0, unbiased=False), (torch.float32,)),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), FLOATS),
    "softmax": (lambda x: torch.softmax(x, -1), FLOATS),
    "softmax_dim0": (lambda x: x.softmax(0), (torch.float32,)),
    "log_softmax": (lambda x: torch.nn.functional.log_softmax(x, dim=-1), FLOATS),
    "layer_norm_by_hand": (lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5), FLOATS),
}

LOOPED = ["sum_last", "amax", "argmax", "softmax", "log_softmax", "layer_norm_by_hand", "max_dim", "prod"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", LOOPED)
def test_looped_reduction_for_long_rows(name, target):
    fn, _ = REDUCTIONS[name]
    with on_target(target) as device, kiln.config.patch(triton_max_persistent_rblock=8, triton_looped_rblock=8):
        x = randn((5, 37), torch.float32, device)
        actual = kiln.compile(fn)(x)
        expected = fn(x)
        for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                        expected if isinstance(expected, tuple) else (expected,)):
            assert_close(a, e)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm_by_hand", "var", "mean"])
def test_normalizations_are_one_kernel(name, target):
    fn, _ = REDUCTIONS[name]
    with on_target(target) as device:
        x = randn((4, 16), torch.float32, device)
        assert kiln.explain(fn)(x).kernel_count == 1


def test_nan_and_inf_follow_eager():
    x = torch.randn(4, 9)
    x[0, 3] = float("nan")
    x[1, :] = float("-inf")
    x[2, 5] = float("inf")
    for fn in (lambda t: t.amax(-1), lambda t: t.sum(-1), lambda t: torch.logsumexp(t, -1),
               lambda t: t.argmax(-1), lambda t: t.softmax(-1)):
        assert_close(kiln.compile(fn)(x), fn(x))


def test_empty_reduction_gives_identity():
    x = torch.randn(3, 0)
    fn = lambda t: t.sum(-1)  # noqa: E731
    assert_close(kiln.compile(fn)(x), fn(x))


def test_reduction_epilogue_and_prologue_fuse():
    def f(x, w):
        y = torch.sigmoid(x * w)              # prologue
        return (y - y.mean(-1, keepdim=True)) * 3  # reduction + epilogue over the rows
    x, w = torch.randn(8, 12), torch.randn(12)
    e = kiln.explain(f)(x, w)
    assert e.kernel_count == 1
    assert_close(kiln.compile(f)(x, w), f(x, w))
