"""GEMM operands padded to aligned sizes (inductor/pad_gemm.py): on by default on CUDA only;
here forced on (``config.pad_gemm="always"``, no size threshold). Values and output strides
must be eager's; the wrapper shows the padded library call."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.inductor.pad_gemm import padded_size
from testing import assert_close

FORCE = dict(pad_gemm="always", pad_gemm_min_mnk=0, pad_gemm_min_intensity=0)


def _wrapper(fn, *args, **cfg):
    with kiln.config.patch(**cfg):
        out = kiln.explain(fn)(*args)
    return out, "\n".join(str(w) for w in out.wrappers)


def test_padded_size():
    assert [padded_size(n, 8) for n in (1, 7, 8, 9, 50257)] == [1, 8, 8, 16, 50264]
    assert padded_size(13, 0) == 13


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_with_odd_sizes(dtype, bias):
    torch.manual_seed(0)
    w = torch.randn(33, 13, dtype=dtype)  # K = 13, N = 33: both padded
    b = torch.randn(33, dtype=dtype) if bias else None
    x = torch.randn(6, 13, dtype=dtype)

    def f(x):
        return F.linear(x, w, b)
    out, src = _wrapper(f, x, **FORCE)
    ref = f(x)
    assert_close(out.result, ref, dtype)
    assert out.result.stride() == ref.stride()
    k2 = 16 if dtype == torch.float32 else 16
    n2 = 36 if dtype == torch.float32 else 40
    # the padded weight, read transposed (as torch's linear of the [N2, K2] buffer, or a view)
    assert f"({n2}, {k2})" in src and ("functional.linear(" in src or f"({k2}, {n2})" in src), src
    _, plain = _wrapper(f, x)  # CPU default: not padded
    assert f"({n2}, {k2})" not in plain and f"({k2}, {n2})" not in plain


def test_padded_product_feeds_a_kernel_and_an_output():
    """The [:, :N] view of the padded product is read by a fused consumer through its row
    stride, and returned with contiguous strides, as eager's."""
    torch.manual_seed(0)
    a, b = torch.randn(10, 7), torch.randn(7, 21)

    def f(a, b):
        y = a @ b
        return torch.relu(y) * 2, y
    out, src = _wrapper(f, a, b, **FORCE)
    ref = f(a, b)
    for o, r in zip(out.result, ref):
        assert_close(o, r, torch.float32)
        assert o.stride() == r.stride()
    assert "(8, 24)" in src, src


def test_bmm_with_odd_sizes():
    torch.manual_seed(0)
    a, b = torch.randn(3, 5, 9), torch.randn(3, 9, 11)
    out, src = _wrapper(torch.bmm, a, b, **FORCE)
    ref = torch.bmm(a, b)
    assert_close(out.result, ref, torch.float32)
    assert out.result.stride() == ref.stride()
    assert "(3, 12, 12)" in src, src


def test_compute_bound():
    from kiln.inductor.pad_gemm import compute_bound
    assert compute_bound(4096, 50257, 768)  # GPT-2's LM head: 638 multiply-adds per element
    assert not compute_bound(8, 50257, 768)  # a decode step's: bound by reading the weight


def test_aligned_and_small_gemms_are_not_padded():
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 24)
    _, src = _wrapper(torch.mm, a, b, **FORCE)
    assert "kiln_kernel" not in src, src  # one library call, nothing copied
    a, b = torch.randn(8, 13), torch.randn(13, 24)
    _, src = _wrapper(torch.mm, a, b, pad_gemm="always")  # below pad_gemm_min_mnk
    assert "kiln_kernel" not in src, src


def test_training_through_padded_gemms():
    """Forward and backward GEMMs (x @ W^T, g @ W, g^T @ x) all padded: gradients as eager's."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(13, 33)
    x = torch.randn(6, 13, requires_grad=True)
    ref = lin(x).sin().sum()
    ref.backward()
    grads = [t.grad.clone() for t in (x, lin.weight, lin.bias)]
    for t in (x, lin.weight, lin.bias):
        t.grad = None
    with kiln.config.patch(**FORCE):
        kiln.reset()
        out = kiln.compile(lambda x: lin(x).sin().sum())(x)
        out.backward()
    kiln.reset()
    assert_close(out, ref, torch.float32)
    for t, g in zip((x, lin.weight, lin.bias), grads):
        assert_close(t.grad, g, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_a_returned_padded_product_is_computed_in_row_chunks(dtype, bias):
    """An LM head whose vocab is padded and whose logits are only returned: the product runs in
    row chunks into one scratch (``prims.mm_compact``), so the padded [M, N2] product and the
    compact [M, N] output are never alive together (GPT-2's and BERT's peak memory held both)."""
    torch.manual_seed(0)
    w = torch.randn(1001, 24, dtype=dtype)  # vocab 1001: N padded to 1004 (fp32) or 1008
    b = torch.randn(1001, dtype=dtype) if bias else None
    x = torch.randn(3, 300, 24, dtype=dtype)  # M = 900 rows: chunks of 256, the last ragged

    def f(x):
        return F.linear(x, w, b)
    out, src = _wrapper(f, x, **FORCE)
    ref = f(x)
    assert_close(out.result, ref, dtype)
    assert out.result.stride() == ref.stride() and out.result.dtype == ref.dtype
    assert "extern_mm_compact(" in src and ", 1001, 256)" in src, src
    n2 = 1004 if dtype == torch.float32 else 1008
    assert f"(900, {n2})" not in src, src  # no whole padded product is allocated


def test_a_padded_product_with_other_users_or_few_rows_is_not_chunked():
    torch.manual_seed(0)
    w = torch.randn(1001, 24)
    x = torch.randn(600, 24)
    out, src = _wrapper(lambda x: torch.softmax(x @ w.t(), -1), x, **FORCE)  # read by a kernel
    assert_close(out.result, torch.softmax(x @ w.t(), -1), torch.float32)
    assert "mm_compact" not in src and "(1004, 24)" in src and \
        ("functional.linear(arg0, buf0)" in src or ("extern_mm(" in src and "(24, 1004)" in src)), src
    small = torch.randn(200, 24)  # one chunk would be the whole product: the plain call
    out, src = _wrapper(lambda x: x @ w.t(), small, **FORCE)
    assert_close(out.result, small @ w.t(), torch.float32)
    assert "mm_compact" not in src and out.result.stride() == (1001, 1), src


def test_the_chunked_product_matches_the_library_on_a_ragged_last_chunk():
    from kiln.ops.op_mm import prim_mm_compact
    torch.manual_seed(0)
    a, b, bias = torch.randn(70, 16), torch.randn(16, 40), torch.randn(40)
    b[:, 37:] = 0  # the padded columns
    for rows in (1, 16, 69, 70, 100):
        got = prim_mm_compact.eager(None, a, b, 37, rows)
        assert got.shape == (70, 37) and got.is_contiguous()
        torch.testing.assert_close(got, (a @ b)[:, :37])
        torch.testing.assert_close(prim_mm_compact.eager(bias, a, b, 37, rows), torch.addmm(bias, a, b)[:, :37])
