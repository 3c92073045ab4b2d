"""A pointwise kernel whose output has eager's non-contiguous strides loops in the output's
stride order when that lets it fuse with a producer stored in memory order (scheduler.py
``memory_order``): one kernel, the same bytes, eager's values and strides."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import assert_close


def _chain(x):
    h = F.gelu(x) * 2 + F.silu(x)       # a multi-use intermediate
    return torch.where(h > 0, h.sigmoid(), h * 0.5) + h.sin() + x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["transposed", "channels_last", "permuted3d"])
def test_output_in_eager_strides_is_one_kernel(dtype, layout):
    if layout == "transposed":
        x = torch.randn(24, 10, dtype=dtype).t()
    elif layout == "channels_last":
        x = torch.randn(2, 6, 5, 7, dtype=dtype).to(memory_format=torch.channels_last)
    else:
        x = torch.randn(5, 3, 4, dtype=dtype).permute(2, 0, 1)
    want = _chain(x)
    got = kiln.compile(_chain, fullgraph=True)(x)
    assert got.stride() == want.stride() and got.dtype == want.dtype
    # kiln's fused kernel rounds once; compare with the fp32 computation rounded (check_model's way)
    assert_close(got, _chain(x.float()).to(dtype))
    assert kiln.explain(_chain)(x).kernel_count == 1


def test_memory_order_keeps_the_bytes():
    from kiln.inductor import ir
    from kiln.inductor.scheduler import memory_order
    i0, i1 = ir.index_symbols(2)
    buf = ir.Pointwise("b", (3, 4), (1, 3), torch.float32, torch.device("cpu"),
                       ir.Load("a", i0 * 7 + i1, torch.float32))
    alt = memory_order(buf)
    assert alt.shape == (4, 3) and alt.stride == (3, 1)
    j0, j1 = ir.index_symbols(2)
    assert alt.body.index == j1 * 7 + j0  # the element stored at offset 3*j0 + j1 is (j1, j0)
    assert memory_order(ir.Pointwise("c", (3, 4), (4, 1), torch.float32, torch.device("cpu"),
                                     ir.Const(1.0, torch.float32))) is None  # already in order
    assert memory_order(ir.Pointwise("d", (3, 4), (1, 4), torch.float32, torch.device("cpu"),
                                     ir.Const(1.0, torch.float32))) is None  # padded: not dense
