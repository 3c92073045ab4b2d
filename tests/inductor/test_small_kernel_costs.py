"""Costs that small training steps on the CPU paid for nothing (session 39, a BERT and a Llama
backward at the CPU zoo's small sizes), each checked for its result against eager and for the
structure that removes the cost:

- a row sum shorter than the vector lanes runs one scalar accumulator (the lane arrays were set
  up, flushed into double partials and combined per kept element: 300 us for 8192 sums of 2);
- sums that fit one float chain get no double partials (the flush would come once, at the end);
- a column sum with a pointwise result fused beside it stays a column reduction (the extra
  result is written in the tile's epilogue) instead of a strided walk per kept element;
- a scatter-add's atomics are only in the loop that runs on several threads (an atomic float
  add is a compare-and-swap loop even on one thread);
- a VJP's zeros are a fill, not a function of a forward tensor (the embedding gradient's zeros
  read the whole weight);
- CPU flash attention's backward returns its grads as [B, T, H, D] memory, as its meta says;
- a name bound to a recycled buffer keeps the old tensor as it is (no view per reuse).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ops import attention
from kiln.meta.tensor_meta import TensorMeta
from testing import assert_close


def _explain(fn, *args):
    with kiln.config.patch(strict=True, cpu_backend="cpp"):
        return kiln.explain(fn, dynamic=False)(*args)


def _bodies(r):
    return [k.source[k.source.index('extern "C" void'):] for k in r.kernels]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_a_short_row_sums_in_one_scalar_accumulator(dtype):
    x = torch.randn(4096, 3, dtype=dtype)
    fn = lambda t: t.sum(-1) * 2  # noqa: E731
    r = _explain(fn, x)
    assert_close(r.result, fn(x), dtype)
    (body,) = _bodies(r)
    assert "acc0_v[" not in body and "acc0_d[" not in body, body


def test_a_short_float_row_sums_in_float_in_order():
    # four floats, summed left to right as eager's does them: equal bits, not a double rounding
    torch.manual_seed(1)
    x = torch.randn(1, 4)
    fn = lambda t: torch.as_strided(t.repeat(3, 1), (4, 3), (1, 4)) + t.sum()  # noqa: E731
    r = _explain(fn, x)
    assert torch.equal(r.result, fn(x))


@pytest.mark.parametrize("width, cascaded", [(256, False), (2048, False), (4096, True)])
def test_double_partials_only_where_a_row_outgrows_one_float_chain(width, cascaded):
    torch.manual_seed(0)
    x = torch.randn(16, width)
    fn = lambda t: t.sum(-1)  # noqa: E731
    r = _explain(fn, x)
    assert_close(r.result, fn(x), torch.float32)
    (body,) = _bodies(r)
    assert ("double acc0_d[" in body) == cascaded, body


@pytest.mark.parametrize("rows, cascaded", [(2, False), (256, False), (1024, True)])
def test_column_sum_double_tile_only_past_one_chain(rows, cascaded):
    torch.manual_seed(0)
    x = torch.randn(rows, 128)
    fn = lambda t: t.sum(0)  # noqa: E731
    r = _explain(fn, x)
    assert_close(r.result, fn(x), torch.float32)
    (body,) = _bodies(r)
    assert "kk < kn" in body and ("acc0_d[" in body) == cascaded, body


def test_a_column_sum_with_a_fused_pointwise_result_stays_a_column_reduction():
    # the position-embedding gradient's batch sum, fused with the attention mask's cast
    torch.manual_seed(0)
    g = torch.randn(2, 64, 128)
    mask = torch.rand(64, 128) > 0.5

    def fn(g, mask):
        return g.sum(0, keepdim=True), mask.float()

    r = _explain(fn, g, mask)
    for got, want in zip(r.result, fn(g, mask)):
        assert_close(got, want, torch.float32)
        assert got.stride() == want.stride()
    fused = [b for b in _bodies(r) if "acc0" in b]
    assert len(fused) == 1 and "kk < kn" in fused[0] and "uint8_t" in fused[0], fused


@pytest.mark.parametrize("threads", [1, 2])
def test_scatter_add_atomics_only_on_several_threads(threads):
    torch.manual_seed(0)
    base = torch.randn(100, 64)
    idx = torch.randint(0, 100, (512,))     # many collisions
    src = torch.randn(512, 64)
    fn = lambda b, i, s: b.index_add(0, i, s) * 1  # noqa: E731
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        r = _explain(fn, base, idx, src)
        again = kiln.compile(fn, dynamic=False)(base, idx, src)
    finally:
        torch.set_num_threads(old)
    want = fn(base.double(), idx, src.double()).float()
    assert_close(r.result, want, torch.float32)
    assert_close(again, want, torch.float32)
    (scatter,) = [b for b in _bodies(r) if "+=" in b and "out_ptr0[" in b and "omp" in b]
    parallel, serial = scatter.split("#endif")
    assert "omp_get_max_threads() > 1" in parallel and "#pragma omp atomic" in parallel
    assert "omp atomic" not in serial and "+=" in serial


def test_a_small_scatter_add_has_no_atomics():
    base, idx, src = torch.zeros(10, 4), torch.randint(0, 10, (32,)), torch.randn(32, 4)
    fn = lambda b, i, s: b.index_add(0, i, s) * 1  # noqa: E731
    r = _explain(fn, base, idx, src)
    assert_close(r.result, fn(base, idx, src), torch.float32)
    assert all("omp atomic" not in b for b in _bodies(r))


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_gradient_zeros_are_a_fill(padding_idx):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(300, 32, padding_idx=padding_idx)
    ids = torch.randint(0, 300, (4, 16))
    ids[0, :3] = 0
    cm = kiln.compile(emb, dynamic=False)
    with kiln.config.patch(strict=True, cpu_backend="cpp"):
        r = kiln.explain(lambda i: cm(i).square().sum().backward())(ids)
    got, emb.weight.grad = emb.weight.grad, None
    emb(ids).square().sum().backward()
    assert_close(got, emb.weight.grad, torch.float32)
    # no kernel reads the weight to make the zeros the gradient accumulates into
    backward = [b for b in _bodies(r) if "abs" in b and "< -1" in b]
    assert not backward, backward


@pytest.mark.parametrize("layout", ["bhtd", "bthd", "other"])
def test_cpu_flash_attention_backward_strides_are_the_metas(layout):
    torch.manual_seed(0)
    if layout == "bhtd":
        q = torch.randn(2, 4, 64, 32)
    elif layout == "bthd":
        q = torch.randn(2, 64, 4, 32).transpose(1, 2)
    else:
        q = torch.randn(4, 2, 64, 32).transpose(0, 1)
    k, v = torch.randn(2, 2, 64, 32), torch.randn(2, 2, 64, 32)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    out, lse, seed, off = attention._fused_eager(q, k, v, None, True, None, "cpu_flash")
    g = torch.randn_like(out)
    grads = attention._fused_backward_eager(g, q, k, v, out, lse, seed, off, None, True, None, "cpu_flash")
    metas = attention._fused_backward_meta(*(TensorMeta.of(t) for t in (g, q, k, v, out, lse, seed, off)),
                                           None, True, None, "cpu_flash")
    for t, m in zip(grads, metas):
        assert tuple(t.shape) == tuple(m.shape) and t.stride() == tuple(m.stride)


def test_recycled_buffers_are_renamed_not_viewed():
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    w1, w2 = torch.randn(128, 128), torch.randn(128, 128)

    def fn(x):
        a = torch.relu(x) * 2                  # a kernel's [64, 128], dead after the matmul
        c = ((a @ w1).view(8, 8, 128) + 1).exp()   # an [8, 8, 128] result: a's memory again
        return c.reshape(64, 128) @ w2         # the matmul reads it as [64, 128]: a's own layout

    r = _explain(fn, x)
    assert_close(r.result, fn(x), torch.float32)
    (src,) = [str(w) for w in r.wrappers]
    reuse = [ln for ln in src.splitlines() if "reuse" in ln]
    renamed = [ln for ln in src.splitlines() if " = as_strided(buf" in ln and "reuse" not in ln]
    assert reuse and not renamed, src
    assert "as_strided" not in src, src  # nor is one made for the matmul: the tensor has its layout


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [64, 1 << 17], ids=["small", "parallel"])
def test_bounds_checks_are_vectorizable_and_still_raise(threads, n):
    # the check ORs into a local flag reduced over threads and lanes; an index out of range
    # anywhere (here only the last) still raises eager's IndexError, and in range the gather
    # matches eager
    torch.manual_seed(0)
    table = torch.randn(32, 8)
    fn = lambda t, i: t[i] * 2  # noqa: E731
    idx = torch.randint(0, 32, (n,))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        r = _explain(fn, table, idx)
        assert_close(r.result, fn(table, idx), torch.float32)
        body = next(b for b in _bodies(r) if "kiln_index_bad" in b)
        assert "reduction(|:kiln_index_bad)" in body and "if (kiln_index_bad) kiln_index_error = 1;" in body
        compiled = kiln.compile(fn, dynamic=False)
        assert_close(compiled(table, idx), fn(table, idx), torch.float32)
        bad = idx.clone()
        bad[-1] = 32
        with pytest.raises(IndexError):
            compiled(table, bad)
        assert_close(compiled(table, idx), fn(table, idx), torch.float32)  # the flag was cleared
    finally:
        torch.set_num_threads(old)


def test_lane_partials_that_cancel_combine_in_double():
    # a row that fits one float chain still combines its 32 lane partials in double: lanes
    # 0, 1 and 2 hold 2^24, 1 and -2^24 (each exact in float); a float combine loses the 1.
    # mobilenet_v1's batch-norm backward sums cancel this way (its stem gradient went 360x
    # further from float64 than eager's with float combines)
    x = torch.zeros(3, 64)
    x[:, 0] = x[:, 32] = 2.0 ** 23
    x[:, 1] = 1.0
    x[:, 2] = x[:, 34] = -(2.0 ** 23)
    fn = lambda t: t.sum(-1) * 1  # noqa: E731
    r = _explain(fn, x)
    assert torch.equal(r.result, torch.ones(3)), r.result
    assert torch.equal(r.result, x.double().sum(-1).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_weight_read_transposed_is_one_linear_call(dtype):
    torch.manual_seed(0)
    x, w, v = torch.randn(16, 32, dtype=dtype), torch.randn(24, 32, dtype=dtype), torch.randn(32, 24, dtype=dtype)
    xt = torch.randn(32, 16, dtype=dtype).t()  # a non-contiguous activation

    def fn(x, w, v, xt):
        return torch.relu(x @ w.t()), (x @ v) * 2, xt @ w.t()

    r = _explain(fn, x, w, v, xt)
    for got, want in zip(r.result, fn(x, w, v, xt)):
        assert torch.equal(got, want), (got - want).abs().max()  # the same library call as eager's
        assert got.stride() == want.stride() and got.dtype == want.dtype
    (src,) = [str(wr) for wr in r.wrappers]
    assert src.count("torch.nn.functional.linear(") == 2 and "extern_mm(" in src, src
    assert "as_strided(arg1" not in src, src  # no view of the weight
