"""Kernels equal up to their names and origin comments (a model's repeated layers) build one
binary: runtime/builder.representatives picks one kernel per distinct source, the others launch
its binary through launchers of their own."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.runtime import builder
from tests.testing import TARGETS, TOLERANCES, on_target


class Block(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = torch.nn.LayerNorm(n)
        self.fc = torch.nn.Linear(n, n)

    def forward(self, x):
        return x + F.gelu(self.fc(self.ln(x)))


def _record(monkeypatch):
    seen = []
    original = builder.representatives

    def spy(kernels, launches):
        reps = original(kernels, launches)
        seen.append((len(kernels), len({id(r) for r in reps})))
        return reps
    monkeypatch.setattr(builder, "representatives", spy)
    return seen


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repeated_layers_build_each_distinct_kernel_once(monkeypatch, target, dtype):
    seen = _record(monkeypatch)
    with on_target(target) as device:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(24) for _ in range(8)]).to(device, dtype)
        x = torch.randn(5, 24, device=device, dtype=dtype)
        with torch.no_grad():
            out = kiln.compile(model)(x)
            expected = model(x)
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out, expected, rtol=rtol * 4, atol=atol * 4)
    kernels, unique = seen[-1]
    assert kernels >= 8 and unique <= 4, seen  # first, repeated middle and last kernels


@pytest.mark.parametrize("target", TARGETS)
def test_kernels_differing_only_in_dtype_keep_their_own_results(monkeypatch, target):
    """One source, two pointer dtypes (a copy of an fp32 and of a bf16 tensor): a Triton JIT
    specializes on the dtypes, so sharing it must still give each kernel its own binary."""
    def f(a, b):
        return a.t().contiguous() * 2, b.t().contiguous() * 2
    with on_target(target) as device:
        a = torch.randn(6, 10, device=device)
        b = torch.randn(6, 10, device=device, dtype=torch.bfloat16)
        got = kiln.compile(f)(a, b)
    torch.testing.assert_close(got[0], a.t() * 2)
    torch.testing.assert_close(got[1], b.t() * 2)
    assert got[1].dtype == torch.bfloat16


def test_canonical_source_ignores_names_and_origins_only():
    a = "# from: x = core.add(a, b)  [m.py:3]\n@triton.jit\ndef kiln_kernel1(in_ptr0):\n    pass\n"
    b = "# from: y = core.add(c, d)  [m.py:9]\n@triton.jit\ndef kiln_kernel12(in_ptr0):\n    pass\n"
    c = "@triton.jit\ndef kiln_kernel12(in_ptr1):\n    pass\n"
    assert builder.canonical_source(a, "kiln_kernel1") == builder.canonical_source(b, "kiln_kernel12")
    assert builder.canonical_source(b, "kiln_kernel12") != builder.canonical_source(c, "kiln_kernel12")
    # a name that is a prefix of another is replaced as a whole name only
    assert "kiln_kernel10" in builder.canonical_source("kiln_kernel1 kiln_kernel10", "kiln_kernel1")
    assert "KILN_KERNEL_check" in builder.canonical_source("kiln_kernel1_check", "kiln_kernel1")
