"""Column reductions (codegen.triton_reduction.is_column_reduction): reductions over strided
dims with contiguous kept dims (bias and norm-weight gradients) tile [XBLOCK kept, RBLOCK
reduced] on Triton so loads are coalesced; values match eager on every target."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn

CASES = {
    "bias_grad": lambda g, x: g.sum((0, 1)),
    "gelu_bwd_and_sum": lambda g, x: (lambda d: (d, d.sum(0)))(g * torch.sigmoid(1.702 * x)),
    "mean0": lambda g, x: x.mean(0),
    "var0": lambda g, x: x.var(0),
    "amax0": lambda g, x: (g * x).amax(0),
    "argmax0": lambda g, x: x.argmax(0),
    "ln_weight_grad": lambda g, x: ((g * F.layer_norm(x, x.shape[-1:])).sum(0), g.sum(0)),
}
SHAPES = {"bias_grad": (3, 37, 70)}


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("name", list(CASES))
def test_column_reduction_matches_eager(name, layout, dtype, target):
    fn = CASES[name]
    shape = SHAPES.get(name, (150, 70))
    with on_target(target) as device:
        g, x = randn(shape, dtype, device, layout), randn(shape, dtype, device)
        got, want = _flat(kiln.compile(fn)(g, x)), _flat(fn(g, x))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            if b.dtype.is_floating_point:  # sums of 150 values: eager rounds each low-precision term
                tol = 1e-4 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * 5)
            else:
                assert torch.equal(a, b)


@pytest.mark.parametrize("target", [t for t in TARGETS if t.id.startswith("triton")])
def test_column_reduction_tiles_over_kept_dim(target):
    with on_target(target) as device:
        x = randn((300, 70), torch.float32, device)
        out = kiln.explain(lambda x: x.sum(0))(x)
        src = "\n".join(str(w) for w in out.wrappers)
        assert "XBLOCK=64" in src and "RBLOCK=32" in src, src
        assert_close(out.result, x.sum(0))
        with kiln.config.patch(triton_column_reductions=False):
            out = kiln.explain(lambda x: x.sum(0))(x)
        assert "XBLOCK=64" not in "\n".join(str(w) for w in out.wrappers)


SPLIT_CASES = {
    "sum0": lambda x: x.sum(0),
    "bias_grad": lambda x: x.sum((0, 1)),
    "amax0_and_pointwise": lambda x: (lambda y: (y, y.amax(0)))(torch.tanh(x) * 3),
    "mean0": lambda x: x.mean(0),
    "ln_grads_short_batch": lambda x: (x.sum((0, 1)), (x * x).sum((0, 1))),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_column_split_matches_eager(name, dtype, target):
    """Few kept elements over many reduced rows: the reduced rows are cut into chunks, an
    [S, kept] partial buffer, then a column reduction over S (forced on here; CUDA only by
    default)."""
    fn = SPLIT_CASES[name]
    shape = {"bias_grad": (4, 512, 24), "ln_grads_short_batch": (2, 2048, 24)}.get(name, (2048, 24))
    with on_target(target) as device, kiln.config.patch(split_column_reductions="always"):
        x = randn(shape, dtype, device)
        out = kiln.explain(fn)(x)
        got, want = _flat(out.result), _flat(fn(x))
        assert out.kernel_count >= 2  # the partial stage and the combining stage
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * 5)


def test_short_leading_dim_splits_the_flattened_rows():
    """A norm-weight gradient over [batch 8, 1024, 768] has a batch too short to cut into enough
    chunks: the flattened 8192 rows are chunked instead (it used to run unsplit, 12 programs
    each walking all 8192 rows)."""
    from kiln.inductor.lowering import split_plan
    cuda = torch.device("cuda")
    assert split_plan("sum", (8, 1024, 768), (0, 1), cuda) == ("column_flat", 64)
    assert split_plan("sum", (8192, 3072), (0,), cuda) == ("column", 32)
    assert split_plan("sum", (8192, 768), (0,), cuda) == ("column", 64)


def test_strided_unravel_simplifies_to_a_linear_index():
    """c*Mod(a, n) + c*n*floor(a/n) is c*a: a flattened chunk of rows, unravelled over
    [batch, seq] and raveled with the row stride, indexes linearly again."""
    import sympy
    from kiln.inductor import ir
    i0, i1, i2 = ir.index_symbols(3)
    a = 128 * i0 + i2
    expr = i1 + 96 * sympy.Mod(a, 1024) + 98304 * sympy.floor(a / 1024)
    got = ir.simplify_index(expr, ir.ranges_of((64, 96, 128)))
    assert sympy.expand(got - (12288 * i0 + i1 + 96 * i2)) == 0 and not got.has(sympy.Mod), got
