"""2D tiled Triton pointwise kernels (codegen/triton_tiled.py, ``config.triton_tile_2d``, on by
default): a kernel that stores along its last dim and loads an input
contiguous along another dim runs over [YBLOCK, XBLOCK] tiles. Values match eager for
transposes and permutes, with broadcast and scalar operands, in every float dtype; kernels
without a transposed load keep the 1-D form."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target, randn

TRITON = [t for t in TARGETS if t.id.startswith("triton")]

# A pointwise result follows its first operand's layout (eager's rule, which graph outputs
# keep), so a permuted operand alone makes no transposed store: .contiguous() asks for one.
CASES = {
    "transpose_copy": (lambda x, b: x.t().contiguous() * 2, (200, 300)),
    "plus_own_transpose": (lambda x, b: x + x.t(), (256, 256)),
    "permute_bias": (lambda x, b: (x.permute(0, 2, 1) + b).contiguous(), (3, 64, 100)),
    "permute_4d": (lambda x, b: (torch.sigmoid(x.permute(0, 2, 3, 1)) * 3).contiguous(), (2, 40, 16, 24)),
    "transpose_scalar_mix": (lambda x, b: (x.transpose(-1, -2) - b[0]).relu().contiguous(), (4, 96, 48)),
}


@pytest.fixture(autouse=True)
def _tiles_on():
    with kiln.config.patch(triton_tile_2d=True):
        yield


@pytest.mark.parametrize("target", TRITON)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_tiled_transposes_match_eager(name, dtype, target):
    fn, shape = CASES[name]
    with on_target(target) as device:
        x = randn(shape, dtype, device)
        b = randn((shape[1],), dtype, device)
        out = kiln.explain(fn)(x, b)
        assert_close(out.result, fn(x, b), dtype)
        assert any("YBLOCK" in k.source for k in out.kernels), [k.source for k in out.kernels]


@pytest.mark.parametrize("target", TRITON)
def test_non_contiguous_input_and_plain_kernels(target):
    with on_target(target) as device:
        x = randn((300, 200), torch.float32, device, "transposed")  # x.t() is contiguous memory
        out = kiln.explain(lambda x: x * 2 + 1)(x)  # stores along x's own layout: no transpose
        assert_close(out.result, x * 2 + 1)
        y = torch.randn(128, 256, device=device)
        out = kiln.explain(lambda y: torch.tanh(y) + 1)(y)
        assert not any("YBLOCK" in k.source for k in out.kernels)
        assert_close(out.result, torch.tanh(y) + 1)
        with kiln.config.patch(triton_tile_2d=False):
            out = kiln.explain(lambda y: y.t().contiguous())(y)
        assert not any("YBLOCK" in k.source for k in out.kernels)
        assert_close(out.result, y.t().contiguous())


CPP = [t for t in TARGETS if t.id == "cpp"]
EDGES = {  # sizes that leave partial tiles on both sides, and a transposed input read twice
    "ragged_transpose": (lambda x, b: (x.t() * 3 - 1).contiguous(), (150, 170)),
    "two_transposed_reads": (lambda x, b: (x.t() * x.t() + torch.exp(x.t())).contiguous(), (200, 99)),
}


@pytest.mark.parametrize("target", CPP)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(CASES) + list(EDGES))
def test_cpp_tiled_transposes_match_eager(name, dtype, target):
    """C++: each tile of a transposed input is copied to a local array along its own
    contiguous dim (full tiles through 8x8 register transposes, ragged ones element by
    element), then read along the store's (codegen/cpp.py _tiled_loops)."""
    fn, shape = {**CASES, **EDGES}[name]
    with on_target(target) as device:
        x = randn(shape, dtype, device)
        b = randn((shape[1],), dtype, device)
        out = kiln.explain(fn)(x, b)
        assert_close(out.result, fn(x, b), dtype)
        assert any("tile0[" in k.source for k in out.kernels), [k.source for k in out.kernels]
        if name in ("transpose_copy", "ragged_transpose"):  # both have full 32x32 tiles
            size = torch.empty((), dtype=dtype).element_size()
            assert any(f"kiln_t8x8_{size}(" in k.source for k in out.kernels)
        if name == "two_transposed_reads":  # one local copy serves both reads
            assert not any("tile1[" in k.source for k in out.kernels)
        with kiln.config.patch(cpp_tile_2d=False):
            plain = kiln.explain(fn)(x, b)
        assert not any("tile0[" in k.source for k in plain.kernels)
        assert_close(plain.result, fn(x, b), dtype)


@pytest.mark.parametrize("target", CPP)
def test_cpp_kernels_without_a_transposed_load_are_not_tiled(target):
    with on_target(target) as device:
        x = randn((300, 200), torch.float32, device, "transposed")
        out = kiln.explain(lambda x: x * 2 + 1)(x)
        assert_close(out.result, x * 2 + 1)
        y = torch.randn(128, 256, device=device)
        out = kiln.explain(lambda y: torch.tanh(y) + 1)(y)
        assert not any("tile0[" in k.source for k in out.kernels)
        assert_close(out.result, torch.tanh(y) + 1)


@pytest.mark.parametrize("target", CPP)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.bool], ids=str)
def test_cpp_tiled_integer_and_bool_transposes(dtype, target):
    """8-, 4- and 2-byte elements move through the register transposes; 1-byte ones (bool)
    take the element-by-element copy."""
    with on_target(target) as device:
        x = torch.randint(0, 50, (160, 130), device=device).to(dtype)
        fn = (lambda x: (x.t() | (x.t() & False)).contiguous()) if dtype == torch.bool else \
            (lambda x: (x.t() * 3 + 1).contiguous())
        out = kiln.explain(fn)(x)
        assert torch.equal(out.result, fn(x))
        assert any("tile0[" in k.source for k in out.kernels), [k.source for k in out.kernels]
