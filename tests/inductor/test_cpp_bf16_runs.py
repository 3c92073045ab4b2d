"""C++ pointwise kernels store bf16 outputs a chunk at a time (codegen/cpp_runs.py): the inner
loop writes float values to a local chunk, and ``kiln_store_bf16_run`` rounds the chunk (on
AVX512-BF16 through ``vcvtneps2bf16``, whose denormal flush is avoided group by group). The
rounded bits must equal eager's for every float: ties, denormals, infinities, signed zeros;
NaN stays NaN."""
import pytest
import torch

import kiln
from testing import assert_close, on_target

CPP = pytest.param(("cpu", "cpp"), id="cpp")


def _special_floats(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * torch.logspace(-44, 38, n).flip(0)  # denormals .. 1e38
    ties = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 2 ** -130, -(2 ** -135),
                         3.3895314e38, float("inf"), -float("inf"), 0.0, -0.0, float("nan"),
                         1.1754942e-38, 1.17549435e-38, 5e-45])
    x[: ties.numel()] = ties
    x[40] = 1e-39  # one denormal in an otherwise normal 16-lane group
    return x


def _same_bits(got: torch.Tensor, want: torch.Tensor):
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    g, w = got[~nan].view(torch.int16), want[~nan].view(torch.int16)
    bad = (g != w).nonzero().flatten()
    assert bad.numel() == 0, [(want[~nan][i].float().item(), hex(g[i] & 0xffff), hex(w[i] & 0xffff))
                              for i in bad[:5].tolist()]


@pytest.mark.parametrize("target", [CPP])
@pytest.mark.parametrize("shape", [(1000,), (7, 150), (3, 5, 64)], ids=str)
def test_rounding_matches_eager_bit_for_bit(shape, target):
    with on_target(target) as device:
        x = _special_floats(torch.Size(shape).numel()).reshape(shape).to(device)
        f = lambda x: (x * 1.0 - 0.0).to(torch.bfloat16)  # noqa: E731 - a float computation stored as bf16
        out = kiln.explain(f)(x)
        _same_bits(out.result.flatten(), f(x).flatten())
        assert any("kiln_store_bf16_run(" in k.source for k in out.kernels)


@pytest.mark.parametrize("target", [CPP])
def test_seed_example_in_bf16_on_strided_and_broadcast_inputs(target):
    with on_target(target) as device:
        def f(x, b):
            return torch.relu(x + b) * 2
        x = torch.randn(300, 130, device=device, dtype=torch.bfloat16).t()  # non-contiguous
        b = torch.randn(300, device=device, dtype=torch.bfloat16)
        assert_close(kiln.compile(f)(x, b), f(x, b), torch.bfloat16)
        x = torch.randn(70, 257, device=device, dtype=torch.bfloat16)
        b = torch.randn(1, 257, device=device, dtype=torch.bfloat16)  # broadcast rows
        out = kiln.explain(f)(x, b)
        _same_bits(out.result.flatten(), f(x.float(), b.float()).to(torch.bfloat16).flatten())
        assert any("kiln_store_bf16_run(" in k.source for k in out.kernels)


@pytest.mark.parametrize("target", [CPP])
def test_float32_outputs_and_the_switch_keep_plain_stores(target):
    with on_target(target) as device:
        x = torch.randn(64, 80, device=device)
        out = kiln.explain(lambda x: x * 2)(x)
        assert not any("kiln_store_bf16_run(" in k.source for k in out.kernels)
        with kiln.config.patch(cpp_bf16_runs=False):
            kiln.reset()
            xb = x.to(torch.bfloat16)
            out = kiln.explain(lambda x: x * 2)(xb)
            assert_close(out.result, xb * 2, torch.bfloat16)
            assert not any("kiln_store_bf16_run(" in k.source for k in out.kernels)


@pytest.mark.parametrize("target", [CPP])
@pytest.mark.parametrize("shape", [(5, 300), (3, 2, 48)], ids=str)
def test_a_row_pass_rounds_its_rows_bit_for_bit(shape, target):
    """A row reduction's output pass (here x - rowmax) stores its bf16 row through a float
    row; rows of denormal-scale values and of ties round as eager does."""
    with on_target(target) as device:
        x = _special_floats(torch.Size(shape).numel()).reshape(shape)
        x = torch.where(x.isfinite(), x, torch.zeros(()))  # rows without inf/nan: a finite max
        x[0] = x[0].abs() * 1e-38  # a row of denormal-scale values
        x = x.to(device)
        f = lambda x: (x - x.amax(-1, keepdim=True)).to(torch.bfloat16)  # noqa: E731
        out = kiln.explain(f)(x)
        _same_bits(out.result.flatten(), f(x).flatten())
        assert any("kiln_store_bf16_run(" in k.source for k in out.kernels)
        assert_close(kiln.compile(torch.nn.functional.layer_norm)(x.to(torch.bfloat16), shape[-1:]),
                     torch.nn.functional.layer_norm(x.to(torch.bfloat16), shape[-1:]), torch.bfloat16)
