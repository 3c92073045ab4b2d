"""C++ reductions: values the row loop does not vary are computed once before it
(``cpp_reduction.hoist_row_invariants``: log_softmax's log of the row sum kept gcc from
vectorizing its output pass), and column reductions whose summed values are also stored run
as column tiles (``cpp_column``)."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.inductor.codegen.cpp_reduction import hoist_row_invariants
from testing import assert_close, randn


def test_only_declarations_free_of_the_loop_move():
    body = [
        "const int64_t i1 = r0;",
        "float tmp0 = in_ptr0[64*i0 + i1];",        # reads along the row: stays
        "float tmp1 = in_ptr1[i0];",                # one address per row: moves
        "float tmp2 = kiln_logf(tmp9);",            # a row value: moves
        "float tmp3 = (tmp0 - tmp2);",              # uses a loop value: stays
        "float tmp4 = scr0[3];",                    # memory the kernel writes: stays
        "if (tmp3 > 0.0f) {",
        "    float tmp5 = (tmp1 * 2.0f);",          # inside a block: stays
        "}",
        "float tmp6 = (tmp5 + tmp1);",              # uses a value that stayed: stays
        "acc0_v[rl] += tmp3;",
        "out_ptr0[64*i0 + i1] = tmp3;",
        "float tmp7 = out_ptr0[i0];",               # an output: stays
    ]
    hoisted, kept = hoist_row_invariants(body)
    assert hoisted == ["float tmp1 = in_ptr1[i0];", "float tmp2 = kiln_logf(tmp9);"]
    assert kept == [ln for ln in body if ln not in hoisted]


def _source(fn, *args):
    with kiln.config.patch(cpu_backend="cpp"):
        ex = kiln.explain(fn)(*args)
    return ex, "\n".join(k.source for k in ex.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_log_softmax_computes_the_row_log_once(dtype, layout):
    x = randn((24, 300), dtype, "cpu", layout)
    fn = lambda x: F.log_softmax(x, -1)  # noqa: E731
    ex, src = _source(fn, x)
    assert_close(ex.result.float(), F.log_softmax(x.float(), -1).to(dtype).float(), dtype)
    body = src[src.index("extern \"C\""):]
    last_loop = body.rindex("for (int64_t r0 = 0;")
    assert "kiln_logf(" in body[:last_loop] and "kiln_logf(" not in body[last_loop:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_stored_values_of_a_column_sum_run_as_column_tiles(dtype, layout):
    def fn(g, x):
        y = g * torch.sigmoid(x)
        return y, y.sum(0)
    g, x = randn((96, 80), dtype, "cpu"), randn((96, 80), dtype, "cpu", layout)
    ex, src = _source(fn, g, x)
    ref = fn(g.float(), x.float())
    assert_close(ex.result[0].float(), ref[0].to(dtype).float(), dtype)
    torch.testing.assert_close(ex.result[1].float(), ref[1], rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=2e-1 if dtype == torch.bfloat16 else 1e-4)
    # the column plan's tile loop, when every load steps by one along the kept dim (a
    # transposed input walks its columns: the row plan stays)
    assert ("kk < kn" in src) == (layout == "contiguous")


def test_a_concatenated_gradient_and_its_column_sum():
    def fn(a, b):
        g = torch.cat([a, b], -1) * 2
        return g, g.sum(0)
    a, b = randn((64, 96), torch.float32, "cpu")[:, :32], randn((64, 48), torch.float32, "cpu")
    ex, src = _source(fn, a, b)
    for o, r in zip(ex.result, fn(a, b)):
        assert_close(o, r)
    assert "kk < kn" in src


CAT_CASES = {  # part widths; tiles are 64 wide
    "qkv, aligned": (128, 128, 128),
    "unequal aligned parts": (64, 192, 128),
    "ragged parts": (64, 100, 36),
    "aligned then ragged": (128, 96),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", list(CAT_CASES))
def test_a_concatenation_tile_reads_only_its_own_part(case, dtype):
    """cpp_column.tile_select: where no part boundary falls inside a tile, each tile picks its
    part's pointer once and loads it contiguously (a q/k/v gradient and its bias gradient);
    elsewhere the per-element select and modulo remain. Results match eager either way."""
    widths = CAT_CASES[case]

    def fn(*parts):
        g = torch.cat(parts, -1)
        return g, g.sum(0)
    parts = [randn((48, w), dtype, "cpu") for w in widths]
    parts[0] = randn((96, widths[0]), dtype, "cpu")[::2]  # a part with strided rows too
    ex, src = _source(fn, *parts)
    ref = fn(*[p.float() for p in parts])
    assert_close(ex.result[0], ref[0].to(dtype), dtype)
    torch.testing.assert_close(ex.result[1].float(), ref[1], rtol=1e-2 if dtype != torch.float32 else 1e-5,
                               atol=1e-1 if dtype != torch.float32 else 1e-4)
    # a pointer per tile where every part is tile-aligned (its start and width multiples of 64)
    aligned = all(w % 64 == 0 for w in widths)
    assert ("tsel" in src) == aligned, src


def test_tile_uniform_comparisons_hold_for_every_element_of_the_tile():
    """k + c < B equals k0 + c < B for every k of a 64-wide tile when B - c is a multiple of
    64 (and <=, >, >= with the boundary shifted by one): checked exhaustively on small ranges."""
    import operator
    ops = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}
    for name, op in ops.items():
        for c in (-128, -64, 0, 64):
            for t in (0, 64, 128, 192):
                B = t + c - (1 if name in ("le", "gt") else 0)
                for k0 in range(0, 256, 64):
                    want = op(k0 + c, B)
                    assert all(op(k + c, B) == want for k in range(k0, k0 + 64)), (name, c, B, k0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_norm_weight_gradient_runs_as_column_tiles(dtype, layout):
    """sum over rows of g * (x - mean) * rstd: mean and rstd are one value per row, the same
    for a whole tile, so they do not keep the column plan out (the row plan walked each column
    down 4096 rows: 11 ms per call in the CPU training step, against 1.5 ms as tiles)."""
    def fn(g, x, mean, rstd):
        return (g * ((x - mean) * rstd)).sum((0, 1)), g.sum((0, 1))
    g, x = randn((4, 24, 80), dtype, "cpu"), randn((4, 24, 80), dtype, "cpu", layout)
    mean, rstd = randn((4, 24, 1), dtype, "cpu"), torch.rand(4, 24, 1).to(dtype) + 0.5
    ex, src = _source(fn, g, x, mean, rstd)
    ref = fn(*(t.float() for t in (g, x, mean, rstd)))
    for o, r in zip(ex.result, ref):
        torch.testing.assert_close(o.float(), r, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                                   atol=2e-1 if dtype == torch.bfloat16 else 1e-4)
    assert ("kk < kn" in src) == (layout == "contiguous")


@pytest.mark.parametrize("name", ["cross_entropy", "logsumexp", "softmax"])
def test_multi_pass_rows_prefetch_the_next_row_when_data_outgrows_cache(name):
    """cpp_reduction.next_row_prefetches: the last lane pass of a row prefetches the next row's
    first-pass reads (cross-entropy over 4096x50257 on 2 cores: 57.6 -> 47.0 ms). Only where
    the rows total 16 MB or more; prefetching cannot change a result, so results match eager."""
    fns = {"cross_entropy": lambda x: F.cross_entropy(x, torch.arange(x.shape[0]) % x.shape[1]),
           "logsumexp": lambda x: torch.logsumexp(x, -1),
           "softmax": lambda x: torch.softmax(x, -1)}
    fn = fns[name]
    big, small = torch.randn(1024, 4096), torch.randn(64, 4096)
    for x, expect in ((big, True), (small, False)):
        ex, src = _source(fn, x)
        assert_close(ex.result, fn(x))
        assert ("__builtin_prefetch" in src) == expect


def test_a_bounds_checked_index_and_its_gather_stay_in_the_loop():
    body = [
        "const int64_t i1 = r0;",
        "float tmp0 = in_ptr0[512*i0 + i1];",
        "int64_t tmp1 = in_ptr1[i0];",                                             # moves
        "int64_t tmp4 = (tmp1 < 0LL ? tmp1 + 100LL : tmp1);",                      # checked: stays
        "if (tmp4 < 0 || tmp4 >= 100) { kiln_index_error = 1; tmp4 = 0; }",
        "float tmp5 = in_ptr2[tmp4];",                                             # after the check
        "float tmp6 = (tmp0 * tmp5);",
    ]
    hoisted, kept = hoist_row_invariants(body)
    assert hoisted == ["int64_t tmp1 = in_ptr1[i0];"]
    assert kept.index("float tmp5 = in_ptr2[tmp4];") > kept.index(
        "if (tmp4 < 0 || tmp4 >= 100) { kiln_index_error = 1; tmp4 = 0; }")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_invariant_gather_out_of_range_raises_instead_of_reading(dtype):
    """A per-row gather inside a row reduction: in range it matches eager; out of range it
    raises IndexError (the gather was once hoisted above its bounds check and read far out of
    range: a segfault)."""
    def fn(x, w, idx):
        return (x * w[idx][:, None]).sum(1)
    x, w = randn((16, 256), dtype, "cpu"), randn((100,), dtype, "cpu")
    idx = torch.randint(-100, 100, (16,))
    compiled = kiln.compile(fn)
    ref = fn(x.float(), w.float(), idx)
    torch.testing.assert_close(compiled(x, w, idx).float(), ref, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=2e-1 if dtype == torch.bfloat16 else 1e-4)
    bad = idx.clone()
    bad[3] = 10 ** 12
    with pytest.raises(IndexError):
        compiled(x, w, bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_pointwise_kernel_computes_per_row_values_once_per_row(dtype, layout):
    """cpp's pointwise loops use the same hoisting: exp(x - log(s)) with s one value per row
    computes log(s) before the vector loop (the training cross-entropy backward recomputed a
    row's log(sum) at every element)."""
    def fn(x, s):
        return torch.exp(x - torch.log(s)[:, None])
    x, s = randn((24, 80), dtype, "cpu", layout), torch.rand(24).to(dtype) + 1
    ex, src = _source(fn, x, s)
    assert_close(ex.result.float(), fn(x.float(), s.float()).to(dtype).float(), dtype)
    body = src[src.index('extern "C" void'):]
    if layout == "contiguous":
        assert body.index("kiln_logf(") < body.index("#pragma omp simd")


def test_a_pointwise_gather_out_of_range_raises():
    def fn(x, w, idx):
        return x * w[idx][:, None] + 1
    x, w = torch.randn(16, 64), torch.randn(100)
    idx = torch.randint(0, 100, (16,))
    compiled = kiln.compile(fn)
    assert_close(compiled(x, w, idx), fn(x, w, idx))
    bad = idx.clone()
    bad[5] = 10 ** 12
    with pytest.raises(IndexError):
        compiled(x, w, bad)
