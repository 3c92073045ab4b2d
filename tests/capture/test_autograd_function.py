"""A user's torch.autograd.Function under capture (kiln/capture/autograd_function.py): with
grad disabled its forward is inlined into the graph (BLOOM's GeLUFunction broke each layer's
graph); with grad enabled it stays a named graph break, and the eager backward is used."""
import pytest
import torch

import kiln
from testing import assert_close


class ScaledGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        assert ctx.needs_input_grad == (False, False) or torch.is_grad_enabled() is False
        return x * 0.5 * scale * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.scale * (x > 0), None


class SetupStyle(torch.autograd.Function):
    @staticmethod
    def forward(x, y):
        return x * y + 1

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return SetupStyle.apply(ScaledGelu.apply(self.fc(x), 2.0), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inference_inlines_the_forward(dtype):
    torch.manual_seed(0)
    m = Block().to(dtype).eval()
    x = torch.randn(4, 8, 16, dtype=dtype).transpose(0, 1)  # non-contiguous
    with torch.no_grad():
        want = m(x)
        out = kiln.explain(m)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    assert_close(out.result, want, dtype)
    assert out.result.stride() == want.stride()
    with torch.no_grad():
        got = kiln.compile(m)(x)
    assert_close(got, want, dtype)
    assert kiln.stats()["eager_runs"] == 0


def test_with_grad_enabled_it_is_a_named_break_and_eager_backward_runs():
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(3, 16, requires_grad=True)
    out = kiln.explain(m)(x)
    assert out.graph_break_count >= 1
    assert any("ScaledGelu.apply with grad enabled" in str(r) for r in out.break_reasons), out.break_reasons
    got = kiln.compile(m)(x)
    got.sum().backward()
    gx, x.grad = x.grad, None
    want = m(x)
    want.sum().backward()
    assert_close(got, want, torch.float32)
    assert_close(gx, x.grad, torch.float32)  # the user's own backward, run by eager autograd


def test_a_replaced_forward_recompiles():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

    f = kiln.compile(lambda x: Twice.apply(x) + 1)
    x = torch.randn(5)
    with torch.no_grad():
        assert_close(f(x), x * 2 + 1, torch.float32)
        Twice.forward = staticmethod(lambda ctx, x: x * 3)
        assert_close(f(x), x * 3 + 1, torch.float32)
