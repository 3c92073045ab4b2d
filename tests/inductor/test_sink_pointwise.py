"""A GELU backward and the GELU recompute its weight gradient needs read the same
pre-activation: they run as one kernel (scheduler: a horizontal fusion that shares an input is
allowed up to the shared bytes by the peak-memory rule; sink_pointwise puts each pointwise
buffer just before its first reader). Gradients match eager."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import api
from kiln.inductor import ir
from kiln.inductor.scheduler import sink_pointwise
from testing import TARGETS, on_target


def _mlp(a, w1, w2):
    return F.gelu(a @ w1, approximate="tanh") @ w2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gelu_recompute_and_backward_share_one_kernel(target, dtype):
    torch.manual_seed(0)
    with on_target(target) as device:
        base = (torch.randn(64, 16, dtype=dtype, device=device),
                torch.randn(16, 48, dtype=dtype, device=device) / 4,
                torch.randn(48, 8, dtype=dtype, device=device) / 7)
        args = [t.clone().requires_grad_() for t in base]
        rec = []
        api._RECORDERS.append(rec)
        try:
            kiln.compile(_mlp)(*args).sum().backward()
        finally:
            api._RECORDERS.remove(rec)
        ref = [t.clone().requires_grad_() for t in base]
        _mlp(*ref).sum().backward()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for got, want in zip(args, ref):
            torch.testing.assert_close(got.grad.float(), want.grad.float(), rtol=tol, atol=tol)
        backward = [c for c in rec if c.kernels and "backward" in c.name]
        assert backward, [c.name for c in rec]
        tanh = [k.name for c in backward for k in c.kernels if "tanh" in k.source]
        if dtype == torch.bfloat16:  # GPT-2's case: recompute and backward in one kernel
            assert len(tanh) == 1, tanh
        else:  # float32 materializes a transposed copy of the recompute for its matmul (to fix)
            assert len(tanh) <= 2, tanh


def test_sink_moves_a_pointwise_buffer_next_to_its_first_reader():
    i0, = ir.index_symbols(1)
    load = lambda b: ir.Load(b, i0, torch.float32)  # noqa: E731
    a = ir.InputBuffer("a", (8,), (1,), torch.float32, torch.device("cpu"))
    p = ir.Pointwise("p", (8,), (1,), torch.float32, torch.device("cpu"), ir.Call("exp", (load("a"),), torch.float32))
    e = ir.Extern("e", "prims.mm", (), {}, (8,), (1,), torch.float32, torch.device("cpu"))
    q = ir.Pointwise("q", (8,), (1,), torch.float32, torch.device("cpu"), ir.Call("neg", (load("p"),), torch.float32))
    prog = ir.LoopProgram([a], [p, e, q], ["q"], torch.device("cpu"))
    assert [b.name for b in sink_pointwise(prog).buffers] == ["e", "p", "q"]
    with kiln.config.patch(sink_pointwise=False):
        prog = ir.LoopProgram([a], [p, e, q], ["q"], torch.device("cpu"))
        assert [b.name for b in sink_pointwise(prog).buffers] == ["p", "e", "q"]


@pytest.mark.parametrize("target", TARGETS)
def test_no_backward_kernel_normalizes_every_layer(target):
    """Each layer's norm backward runs in its own kernels: none computes several layers'
    normalized activations ahead of their use (the shape a partition that recomputes the
    residual stream, or a far-reaching horizontal fusion, once produced: one early kernel for
    all layers, 2.5 ms and hundreds of MB live on GPT-2)."""
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    from gpt import GPT, GPTConfig
    torch.manual_seed(0)
    with on_target(target) as device, kiln.config.patch(split_column_reductions="always"):
        model = GPT(GPTConfig(vocab=64, seq=32, layers=4, heads=4, dim=64)).to(device, torch.bfloat16)
        x = torch.randint(0, 64, (2, 32), device=device)
        rec = []
        api._RECORDERS.append(rec)
        try:
            kiln.compile(model)(x, x).backward()
        finally:
            api._RECORDERS.remove(rec)
        norms = [sum("rsqrt" in o for o in (k.origins or ())) for c in rec if "backward" in c.name
                 for k in c.kernels]
        assert norms and max(norms) <= 2, norms
        # the forward: each norm's saved variance is computed by that norm's own kernel, which
        # reads the same rows, not piled into the last norm's kernel (re-reading every layer)
        variances = [sum("core.var(" in o for o in (k.origins or ())) for c in rec
                     if "backward" not in c.name for k in c.kernels]
        assert variances and max(variances) <= 3, variances


@pytest.mark.parametrize("target", TARGETS)
def test_gelu_backward_computes_tanh_once(target):
    """GPT-2's MLP in bf16: the backward kernel that recomputes GELU for the weight gradient's
    GEMM (reading the pre-activation as bf16, widened) and computes GELU's derivative (reading
    it as float32) shares one load and one tanh: widening to the computed type is no op."""
    import re
    torch.manual_seed(0)
    with on_target(target) as device:
        fc = torch.nn.Linear(32, 96).to(device, torch.bfloat16)
        proj = torch.nn.Linear(96, 32).to(device, torch.bfloat16)

        def mlp(x):
            return x + proj(F.gelu(fc(x), approximate="tanh"))
        x = torch.randn(2, 16, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
        rec = []
        api._RECORDERS.append(rec)
        try:
            kiln.compile(mlp)(x).float().square().sum().backward()
        finally:
            api._RECORDERS.remove(rec)
        got = [x.grad] + [p.grad for p in (*fc.parameters(), *proj.parameters())]
        for t in [x, *fc.parameters(), *proj.parameters()]:
            t.grad = None
        mlp(x).float().square().sum().backward()
        want = [x.grad] + [p.grad for p in (*fc.parameters(), *proj.parameters())]
        for a, b in zip(got, want):
            torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)
        bodies = [re.split(r'extern "C"|@triton\.jit', k.source)[-1]  # the kernel, not its helpers
                  for c in rec for k in c.kernels]
        derivative = [b for b in bodies if "0.134145" in b]  # d/dx of 0.044715 x^3: GELU's backward
        assert len(derivative) == 1, "\n\n".join(bodies)
        assert len(re.findall(r"tanh[f]?\(|tl\.sigmoid\(2\.0 \*", derivative[0])) == 1, derivative[0]
