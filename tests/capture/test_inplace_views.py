"""In-place view ops (``unsqueeze_``, ``squeeze_``, ``t_``, ``transpose_``; PyTorch's
test_torchinductor test_unsqueeze_inplace) change a tensor's shape and strides, not its memory:
capture rebinds the tensor's Variable to the view, so later reads, writes and earlier views of
the same memory agree with eager. On an input (whose shape the caller would see change) they
are a graph break, and the eager run changes the caller's tensor as eager does."""
import pytest
import torch

import kiln
from mutation_helpers import check_mutation
from testing import randn

aten = torch.ops.aten


def aten_unsqueeze(a):
    tmp1 = a + 1
    aten.unsqueeze_(tmp1, 2)
    tmp2 = aten.unsqueeze_(a + 1, 0) + 2
    return tmp1, tmp2


def views_and_writes(a):
    y = a * 2
    v = y[0]                     # a view taken before the shape changes
    y.t_()
    y.add_(1)                    # writes through the transposed tensor reach v
    z = y.unsqueeze_(0).squeeze_(0)
    z.transpose_(0, 1)
    return y, v, z * 1, y.stride()


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_inplace_views_match_eager(layout, dtype):
    check_mutation(aten_unsqueeze, lambda: [randn((2, 3, 2, 2), dtype, "cpu", layout)], "kiln",
                   dtype=dtype)
    check_mutation(views_and_writes, lambda: [randn((2, 3), dtype, "cpu", layout)], "kiln",
                   dtype=dtype)


def test_returns_the_same_tensor():
    def f(a):
        y = a + 1
        return y.unsqueeze_(0) is y
    assert kiln.compile(f, fullgraph=True)(torch.randn(3)) is True


def test_on_an_input_it_is_a_break_with_eager_effect():
    def f(a):
        a.unsqueeze_(0)
        return a + 1
    with pytest.raises(kiln.GraphBreakError, match="changing the shape of an input"):
        kiln.compile(f, fullgraph=True)(torch.randn(3))
    x, x2 = torch.randn(3), None
    x2 = x.clone()
    out = kiln.compile(f)(x)
    torch.testing.assert_close(out, f(x2))
    assert x.shape == x2.shape == (1, 3)
