"""Gradients through complex values that join fallback nodes: ``torch.fft.fftn(h).real`` is two
fallbacks (``fft_fftn``, ``real``) joined by a complex tensor. The complex tensor carried no
gradient flag, so h's gradient through the transform was dropped without a word while its
other uses still got theirs (transformers' FNet: every parameter below the last Fourier layer
had a wrong gradient, up to 100% of its size)."""
import pytest
import torch

import kiln

CASES = {
    "fftn_real_plus_input": lambda h: h + torch.fft.fftn(h, dim=(1, 2)).real,
    "fft_imag_plus_input": lambda h: h + torch.fft.fft(h).imag,
    "view_as_real": lambda h: h + torch.view_as_real(torch.fft.fftn(h, dim=(1, 2)))[..., 0],
    "rfft_times_input": lambda h: h[..., :5] * torch.fft.rfft(h).real,
    "complex_views_between": lambda h: h + torch.fft.fft(h).transpose(1, 2).reshape(2, 8, 6).transpose(1, 2).real,
    "ifft_of_fft": lambda h: h + torch.fft.ifft(torch.fft.fft(h)).real,
}


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_through_complex_fallbacks(name, backend):
    transform = CASES[name]

    def loss(x, w):
        y = transform(x @ w)  # an intermediate, used twice: the sum of both paths is the gradient
        return (y * torch.linspace(0.5, 1.5, y.numel()).view(y.shape)).sum()
    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    want = torch.autograd.grad(loss(x, w), (x, w))
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(loss, backend=backend)(x, w), (x, w))
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_core_op_on_complex_with_gradient_breaks_instead_of_dropping_it(backend):
    # core elementwise ops have no complex gradient rules: the product is a break, eager's
    # autograd runs it, and the gradient through it is eager's
    def loss(x, w):
        h = x @ w
        y = h + (torch.fft.fft(h) * 2).real
        return (y * torch.linspace(0.5, 1.5, y.numel()).view(y.shape)).sum()
    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    want = torch.autograd.grad(loss(x, w), (x, w))
    kiln.reset()
    out = kiln.explain(loss, backend=backend)(x, w)
    assert out.graph_break_count >= 1
    assert any("complex" in str(r) for r in out.break_reasons), out.break_reasons
    for g, e in zip(torch.autograd.grad(out.result, (x, w)), want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
