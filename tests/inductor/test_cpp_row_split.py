"""C++ reductions over leading and trailing dims (batch norm's (0, 2, 3) over NCHW): the row is
an outer loop over the leading reduced dims around a vectorized inner run over the trailing
ones (cpp_reduction.row_split), instead of one flat counter with a division and a modulo per
element. Results against eager for fp32/bf16, ragged inner runs, channels-last and strided
inputs; the structure is checked in the generated source."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import assert_close


def _kernels(fn, *args):
    with kiln.config.patch(strict=True):
        r = kiln.explain(fn)(*args)
    return r, [k.source.split('extern "C"')[1] for k in r.kernels]


def _bn(x, w, b):
    return F.relu(F.batch_norm(x, None, None, w, b, training=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 8, 16, 16), (3, 5, 7, 7), (2, 3, 9, 13)], ids=["16x16", "7x7", "9x13"])
def test_batch_norm_rows_split(shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    w, b = torch.randn(shape[1]).to(dtype), torch.randn(shape[1]).to(dtype)
    r, sources = _kernels(_bn, x, w, b)
    assert_close(r.result, _bn(x, w, b), dtype)
    red = [s for s in sources if "acc0" in s]
    assert red and all("for (int64_t ro = 0; ro < " in s for s in red)
    inner = shape[2] * shape[3]
    # the loads of the row read the inner counter directly: no modulo in their index
    loads = re.findall(r"in_ptr0\[([^\]]*)\]", red[0])
    assert loads and all("ri" in ld and "%" not in ld for ld in loads)
    if inner % 32:
        assert f"ri = {inner // 32 * 32}; ri < {inner}" in red[0]  # the ragged tail


def test_channels_last_and_strided_rows():
    torch.manual_seed(1)
    x = torch.randn(2, 6, 8, 8).to(memory_format=torch.channels_last)
    w, b = torch.randn(6), torch.randn(6)
    r, _ = _kernels(_bn, x, w, b)
    assert_close(r.result, _bn(x, w, b), torch.float32)
    y = torch.randn(2, 6, 8, 16)[..., ::2]   # a strided last dim
    r, _ = _kernels(_bn, y, w, b)
    assert_close(r.result, _bn(y, w, b), torch.float32)


def test_sum_over_non_adjacent_dims_and_its_gradient():
    torch.manual_seed(2)
    x = torch.randn(4, 3, 20, 5, requires_grad=True)

    def fn(x):
        return (x.sum((0, 2), keepdim=True) * x).var((0, 2, 3))
    with kiln.config.patch(strict=True):
        out = kiln.compile(fn)(x)
    assert_close(out, fn(x), torch.float32)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, x, g)[0]
    want = torch.autograd.grad(fn(x), x, g)[0]
    assert_close(got, want, torch.float32)


def test_short_inner_runs_keep_one_flat_loop():
    """A 2x2 image: an inner run of 4 is not worth its own loop."""
    x = torch.randn(16, 4, 2, 2)
    w, b = torch.randn(4), torch.randn(4)
    r, sources = _kernels(_bn, x, w, b)
    assert_close(r.result, _bn(x, w, b), torch.float32)
    assert not any("for (int64_t ro" in s for s in sources)


def test_row_split_off_gives_the_same_results():
    torch.manual_seed(3)
    x = torch.randn(3, 4, 10, 10)
    w, b = torch.randn(4), torch.randn(4)
    with kiln.config.patch(cpp_row_split=False):
        r, sources = _kernels(_bn, x, w, b)
    assert not any("for (int64_t ro" in s for s in sources)
    assert_close(r.result, _bn(x, w, b), torch.float32)
