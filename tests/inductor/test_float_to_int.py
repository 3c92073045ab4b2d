"""Float to integer conversions in C++ kernels are eager's on x86, out of range and NaN
included (``cpp.kiln_f2i``). A plain cast is undefined there, and under -fno-trapping-math
gcc folds ``(float)(int)x`` into a truncation: ``x.to(torch.int32).to(x.dtype)`` of a NaN
came back NaN, where eager gives -2^31."""
import pytest
import torch

import kiln

SPECIALS = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, -3.7, 2.5, 300.0, -1.0, 1e20, -0.0]


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"), reason="x86 conversions")
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_conversion_matches_eager(src, dst):
    x = torch.tensor(SPECIALS * 9, dtype=src)

    def fn(x):
        return x.to(dst), x.to(dst).to(x.dtype) + 1
    with kiln.config.patch(cpu_backend="cpp"):
        got = kiln.compile(fn)(x)
    for g, w in zip(got, fn(x)):
        assert g.dtype == w.dtype
        assert torch.equal(g, w), (g.tolist(), w.tolist())
