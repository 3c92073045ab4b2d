"""Split reductions (lowering.split_plan): few rows over a long extent become two kernels, a
partial reduction over (row, chunk) and a second one over the chunks; values match eager."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target, randn

SMALL = dict(split_reduction_min_rnumel=256, split_reduction_min_chunk=64,
             split_reduction_rows_cpu=64, split_reduction_rows_cuda=64)

CASES = {
    "sum_all": lambda x: x.sum(),
    "mean_all": lambda x: x.mean(),
    "amax_all": lambda x: x.amax(),
    "min_all": lambda x: torch.min(x),
    "prod_all": lambda x: (x * 0.01 + 1).prod(),
    "any_all": lambda x: (x > 2.5).any(),
    "all_all": lambda x: (x > -2.5).all(),
    "sum_rows": lambda x: x.sum(-1),
    "logsumexp_all": lambda x: torch.logsumexp(x.flatten(), 0),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(64, 128), (3, 4096)], ids=["dim", "flat"])
@pytest.mark.parametrize("name", list(CASES))
def test_split_reduction_matches_eager(name, shape, target):
    fn = CASES[name]
    with on_target(target) as device, kiln.config.patch(**SMALL):
        x = randn(shape, torch.float32, device)
        out = kiln.explain(fn)(x)
        expected = fn(x)
        assert out.result.dtype == expected.dtype and out.result.shape == expected.shape
        assert_close(out.result, expected, dtype=torch.float32 if expected.dtype.is_floating_point else None)


@pytest.mark.parametrize("target", TARGETS)
def test_split_sum_is_two_kernels_with_many_partial_rows(target):
    with on_target(target) as device, kiln.config.patch(**SMALL):
        x = randn((64, 128), torch.float32, device)
        out = kiln.explain(lambda x: x.sum())(x)
        assert out.kernel_count == 2
        wrapper = str(out.wrappers[0])
        assert "empty_strided((64,)" in wrapper  # 64 partial sums, one per chunk
        # 8192 terms summed in another order: float32 rounding scales with their magnitudes
        torch.testing.assert_close(out.result, x.sum(), rtol=1e-5, atol=1e-6 * x.abs().sum().item())
    with on_target(target) as device, kiln.config.patch(split_reductions=False, **SMALL):
        assert kiln.explain(lambda x: x.sum())(x).kernel_count == 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_low_precision_partials_stay_float32(dtype, target):
    with on_target(target) as device, kiln.config.patch(**SMALL):
        x = randn((3, 4096), dtype, device)
        out = kiln.explain(lambda x: x.sum())(x)
        assert "dtype=torch.float32" in str(out.wrappers[0])
        assert_close(out.result, x.sum(), dtype=dtype)


def test_flat_split_index_is_linear():
    # the unravelled flat index of a contiguous input collapses back to one linear term
    with kiln.config.patch(cpu_backend="cpp", **SMALL):
        out = kiln.explain(lambda x: x.sum())(torch.randn(3, 4096))
        assert "%" not in out.kernels[0].source.split("extern \"C\" void kiln_kernel0")[1]


def test_no_split_for_many_rows_or_argmax():
    with kiln.config.patch(cpu_backend="cpp", **SMALL):
        assert kiln.explain(lambda x: x.sum(-1))(torch.randn(512, 1024)).kernel_count == 1
        assert kiln.explain(lambda x: x.argmax())(torch.randn(64, 128)).kernel_count == 1
