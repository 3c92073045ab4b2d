"""torch.nn.functional's Python functions with no capture-table entry: a fallback node where it
serves (no gradient needed), else torch's Python body is traced (so a loss or normalization
with a gradient fuses and differentiates instead of breaking), and a break inside that body
runs the call natively, as the break it is, not as a silent or counted eager run."""
import pytest
import torch
import torch.nn.functional as F

import kiln

T = torch.rand(2, 4, 8, 8)
CASES = {  # name -> (fn, kiln (graphs, breaks) with a gradient)
    "normalize": (lambda x: F.normalize(x, dim=1), (1, 0)),
    "softmin": (lambda x: F.softmin(x, 1), (1, 0)),
    # F.selu is a fallback node, differentiable by replaying torch's autograd (ops/core_fallback.py)
    "selu_celu_softsign": (lambda x: F.softsign(x) + F.tanhshrink(x) + F.selu(x), (1, 0)),
    "smooth_l1": (lambda x: F.smooth_l1_loss(x, T), None),
    "bce": (lambda x: F.binary_cross_entropy(torch.sigmoid(x), T), None),
    "unfold": (lambda x: F.unfold(x, 3), None),
    "max_pool3d": (lambda x: F.max_pool3d(x.unsqueeze(1), 2), None),
    # the fallback refuses (its result holds None): the body is traced instead
    "multi_head_attention": (lambda x: F.multi_head_attention_forward(
        x.flatten(2).permute(2, 0, 1)[..., :4].contiguous(), x.flatten(2).permute(2, 0, 1)[..., :4],
        x.flatten(2).permute(2, 0, 1)[..., :4], 4, 2, W_IN, B_IN, None, None, False, 0.0, W_OUT, B_OUT,
        need_weights=False)[0], (1, 0)),
}
torch.manual_seed(1)
W_IN, B_IN, W_OUT, B_OUT = torch.randn(12, 4), torch.randn(12), torch.randn(4, 4), torch.randn(4)


def _explain(fn, x):
    kiln.reset()
    out = kiln.explain(fn)(x)
    return out.graph_count, out.graph_break_count


@pytest.mark.parametrize("name", list(CASES))
def test_without_a_gradient_one_graph(name):
    fn, _ = CASES[name]
    x = torch.randn(2, 4, 8, 8).transpose(2, 3)  # non-contiguous
    assert _explain(fn, x) == (1, 0)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x), rtol=1e-5, atol=1e-5)
    assert kiln.stats()["eager_runs"] == 0


@pytest.mark.parametrize("name", list(CASES))
def test_with_a_gradient_matches_eager_and_runs_no_frame_eagerly(name):
    fn, want_counts = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    counts = _explain(fn, x)
    if want_counts is not None:
        assert counts == want_counts
    kiln.reset()
    got = kiln.compile(fn)(x)
    want = fn(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g_got, = torch.autograd.grad(got.sum(), x)
    g_want, = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["eager_runs"] == 0  # a break inside torch's body is a break, not more
