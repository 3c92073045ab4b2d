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
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_column_split_matches_eager(name, dtype, target):
    """Few kept elements over many reduced rows: the reduced rows are cut into chunks, an
    [S, kept] partial buffer, then a column reduction over S (forced on here; CUDA only by
    default)."""
    fn = SPLIT_CASES[name]
    shape = (4, 512, 24) if name == "bias_grad" else (2048, 24)
    with on_target(target) as device, kiln.config.patch(split_column_reductions="always"):
        x = randn(shape, dtype, device)
        out = kiln.explain(fn)(x)
        got, want = _flat(out.result), _flat(fn(x))
        assert out.kernel_count >= 2  # the partial stage and the combining stage
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * 5)
