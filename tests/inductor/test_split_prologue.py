"""The first stage of a split reduction takes in the pointwise kernel that produces its input
(a bias gradient's column sums with the GELU backward before them, a full sum with the chain
that makes its operand): one pass computes, stores and reduces. Results match eager on every
target, in fp32 and bf16, with the split forced on (it is CUDA-only by default)."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, on_target

TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gradient_sums_fuse_with_the_gelu_backward(target, dtype):
    torch.manual_seed(0)
    with on_target(target) as device, kiln.config.patch(split_column_reductions="always"):
        fc, pr = torch.nn.Linear(16, 64).to(device, dtype), torch.nn.Linear(64, 16).to(device, dtype)
        ref_fc, ref_pr = (torch.nn.Linear(16, 64).to(device, dtype), torch.nn.Linear(64, 16).to(device, dtype))
        ref_fc.load_state_dict(fc.state_dict())
        ref_pr.load_state_dict(pr.state_dict())

        def mlp(a, b, x):
            return b(F.gelu(a(x), approximate="tanh"))
        x = torch.randn(4, 512, 16, device=device, dtype=dtype)
        g = kiln.compile(mlp)
        g(fc, pr, x).float().square().mean().backward()
        mlp(ref_fc, ref_pr, x).float().square().mean().backward()
        rtol, atol = TOL[dtype]
        for p, r in zip([*fc.parameters(), *pr.parameters()], [*ref_fc.parameters(), *ref_pr.parameters()]):
            torch.testing.assert_close(p.grad, r.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fuse", [True, False])
def test_the_split_stage_holds_its_producer_and_stores_it_once(target, fuse):
    def f(x, y, w):
        t = torch.tanh(x) * y          # a GEMM operand (so in memory), and summed over rows
        return t @ w, t.sum(0)

    with on_target(target) as device, \
            kiln.config.patch(split_column_reductions="always", fuse_split_prologue=fuse):
        x, y, w = (torch.randn(4096, 24, device=device), torch.randn(4096, 24, device=device),
                   torch.randn(24, 8, device=device))
        ex = kiln.explain(f)(x, y, w)
        # the product and the first stage share a kernel; the second stage is its own
        want_kernels = 2 if fuse else 3
        assert (ex.kernel_count, ex.extern_calls) == (want_kernels, 1), (ex.kernel_count, ex.extern_calls)
        got, want = kiln.compile(f)(x, y, w), f(x, y, w)
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
