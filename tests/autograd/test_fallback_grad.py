"""Gradients through fallback nodes (a torch callable with no core op, run eagerly inside the
graph): the backward replays torch's autograd of the call on the saved inputs
(ops/core_fallback.py ``fallback_vjp``). ``as_strided`` reads its operand's storage, so the
replay must see the operand laid out as eager's (PyTorch's test_conv_with_as_strided)."""
import pytest
import torch

import kiln
from testing import assert_close

DTYPES = [torch.float32, torch.bfloat16]


def _grads(fn, inputs, compiled):
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = (kiln.compile(fn, fullgraph=True) if compiled else fn)(*leaves)
    torch.manual_seed(1)
    g = torch.randn(out.shape, dtype=out.dtype)
    return out, torch.autograd.grad(out, [x for x in leaves if x.requires_grad], g)


def _check(fn, *inputs):
    want, want_g = _grads(fn, inputs, False)
    got, got_g = _grads(fn, inputs, True)
    assert got.dtype == want.dtype and got.stride() == want.stride()
    assert_close(got, want)
    for a, b in zip(got_g, want_g):
        assert a.dtype == b.dtype
        assert_close(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_as_strided_of_a_padded_conv_output(dtype):
    torch.manual_seed(0)
    w = (torch.randn(12, 8, 1, 1) * 0.3).to(dtype).requires_grad_()

    def fn(x, w):
        c = torch.nn.functional.conv2d(x, w)
        p = torch.ops.aten.constant_pad_nd.default(c, [2, 2, 2, 2], 0.0)  # [2, 12, 10, 10]
        a = torch.ops.aten.as_strided.default(p, [2, 12, 2, 6, 4], [1200, 100, 40, 1, 10])
        a1 = torch.ops.aten.as_strided.default(a, [2, 12, 2, 2, 4, 4], [1200, 100, 40, 3, 10, 1])
        return torch.ops.aten.clone.default(a1, memory_format=torch.contiguous_format)
    _check(fn, torch.randn(2, 8, 6, 6, dtype=dtype).requires_grad_(), w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_as_strided_with_overlap_of_a_transposed_intermediate(dtype):
    # eager keeps the transposed layout of x.t() * 2; the windows overlap, so the gradient
    # accumulates (torch's as_strided_backward)
    fn = lambda x: torch.as_strided(x.t() * 2, (3, 4), (1, 2), 1).sin()  # noqa: E731
    _check(fn, torch.randn(5, 6, dtype=dtype).requires_grad_())


@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_output_and_list_fallbacks(dtype):
    def fn(x, y):
        v = torch.sort(x, 1).values  # two results, one needs a gradient
        return torch.kron(v, y).cos() + torch.logcumsumexp(v, 0).sum()
    _check(fn, torch.randn(3, 4, dtype=dtype).requires_grad_(),
           torch.randn(2, 2, dtype=dtype).requires_grad_())


def test_no_graph_break_for_the_gradient():
    x = torch.randn(5, 6, requires_grad=True)
    e = kiln.explain(lambda x: torch.as_strided(x * 2, (3, 4), (1, 3), 1))(x)
    assert e.graph_break_count == 0


def test_a_gradient_through_a_random_or_python_fallback_is_a_graph_break():
    # replaying torch.normal in the backward would draw again: d out / d std needs the draw
    x = torch.randn(64, requires_grad=True)
    for fn, word in ((lambda x: torch.normal(x, x.abs() + 1), "random"),):
        e = kiln.explain(fn)(x)
        assert e.graph_break_count == 1 and word in e.break_reasons[0].reason
    fn = lambda x: torch.normal(x * 2, 1.0).sin()  # noqa: E731
    kiln.compile(fn)(x).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    fn(x_ref).sum().backward()
    assert_close(x.grad, x_ref.grad)  # torch's formula (zeros for the mean)
