"""Shape ops beyond the op table (tests/ops/optable/shape.py): views fuse into one kernel, a slice
of an input feeds mm without a copy, and subscript syntax."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target, randn

F32 = (torch.float32,)
MIXED = (torch.float32, torch.bfloat16, torch.int64)

STEP = (slice(1, 3), slice(None, None, 2), slice(1, None))
STEP2 = (slice(None), slice(None, None, 2), slice(1, None))
NEGATIVE = (slice(-2, None), slice(None, -1), slice(-3, -1))
LAST_ZERO = (Ellipsis, 0)
MIXED_KEY = (slice(None), 2, slice(-1, None))
NONE_ELLIPSIS = (None, Ellipsis, None)
FIRST_ROWS = (0, slice(1, None))


def make_inputs(dtype, device):
    x = randn((5, 6, 4), dtype, device).permute(2, 1, 0)  # (4, 6, 5), non-contiguous
    y = randn((6, 5), dtype, device)
    return x, y


@pytest.mark.parametrize("target", TARGETS)
def test_views_fuse_into_one_kernel(target):
    def f(x):
        a = x.__getitem__(STEP).flip(0) * 2
        b = torch.roll(x.narrow(0, 1, 2), 1, 1).__getitem__(STEP2)
        return torch.sigmoid(a + b).repeat(1, 1, 1)
    with on_target(target) as device:
        x = make_inputs(torch.float32, device)[0]
        assert kiln.explain(f)(x).kernel_count == 1
        assert_close(kiln.compile(f, fullgraph=True)(x), f(x))


def test_slice_of_input_feeds_mm_without_a_copy():
    def f(x, w):
        return x.narrow(1, 1, 8) @ w.t().narrow(0, 1, 8)
    x, w = torch.randn(8, 9), torch.randn(7, 9)
    explain = kiln.explain(f)(x, w)
    assert explain.kernel_count == 0
    assert_close(kiln.compile(f, fullgraph=True)(x, w), f(x, w))


def test_subscript_syntax():
    fn = lambda x: x[1:3, ::2, None, 0] * 2 + x[-1, ::2, None, 0]  # noqa: E731
    x = make_inputs(torch.float32, torch.device("cpu"))[0]
    assert_close(kiln.compile(fn, fullgraph=True)(x), fn(x))
