"""A write through an index that names a position twice (``x[i] = v``, index_put, scatter, a
plain put with repeated index pairs) stores one of that position's values, as eager does: it
used to receive their sum (the decomposition cleared the covered positions and then added).
The storing scatter prims (``prims.index_copy``, ``prims.scatter_store``) write instead of
add; C++ keeps the last value in source order, as eager's CPU kernels do, and on Triton the
case with equal values (whichever wins) is checked."""
import pytest
import torch

import kiln
from testing import TARGETS, on_target


def setitem_repeated(a, i, v):
    a = a * 2
    a[i] = v
    return a


def index_put_pairs(a, i, j, v):
    return torch.index_put(a + 1, (i, j), v)


def scatter_repeated(a, i, v):
    return torch.scatter(a * 2, 0, i, v)


def _cases(device, dtype, distinct_values):
    a = torch.randn(6, 5, device=device).to(dtype)
    i = torch.tensor([0, 3, 0, 5, 3], device=device)
    rows = torch.randn(1 if not distinct_values else 5, 5, device=device).to(dtype)
    pair_i, pair_j = torch.tensor([1, 1, 4], device=device), torch.tensor([2, 2, -1], device=device)
    pv = torch.randn(1 if not distinct_values else 3, device=device).to(dtype)
    si = torch.tensor([[0, 2, 2, 1, 0], [0, 2, 1, 1, 5]], device=device)
    sv = torch.randn(2, 5, device=device).to(dtype)
    if not distinct_values:
        sv = sv[:1].expand(2, 5).contiguous()
        si = torch.tensor([[0, 2, 2, 1, 0], [0, 2, 2, 1, 0]], device=device)
    return [(setitem_repeated, (a, i, rows.expand(5, 5) if not distinct_values else rows)),
            (index_put_pairs, (a, pair_i, pair_j, pv.expand(3) if not distinct_values else pv)),
            (scatter_repeated, (a, si, sv))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_repeated_indices_store_the_last_value_on_cpp(dtype):
    for fn, args in _cases("cpu", dtype, True):
        expected = fn(*args)
        actual = kiln.compile(fn, fullgraph=True)(*args)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_repeated_integer_rows():
    a = torch.randint(-9, 9, (6, 5))
    i, v = torch.tensor([0, 3, 0, 5, 3]), torch.randint(-9, 9, (5, 5))
    torch.testing.assert_close(kiln.compile(setitem_repeated, fullgraph=True)(a, i, v),
                               setitem_repeated(a, i, v), rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_repeated_indices_with_equal_values_store_that_value(target):
    with on_target(target) as device:
        for fn, args in _cases(device, torch.float32, False):
            expected = fn(*args)
            actual = kiln.compile(fn, fullgraph=True)(*args)
            torch.testing.assert_close(actual, expected, rtol=0, atol=0)
