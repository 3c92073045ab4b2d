"""nn.MultiheadAttention and nn.TransformerEncoderLayer (torchvision's ViT, many user models) in
one graph: torch.nn.functional's Python helpers are inlined where the capture table has no entry
(_canonical_mask, _none_or_dtype, multi_head_attention_forward), its __torch_function__ checks
are False for traced tensors, and the fused inference fast path is traced as its composite.
Before: 9-15 breaks per call. Results against eager, forward and gradients."""
import pytest
import torch

import kiln
from testing import assert_close


def _counts(fn, *args):
    kiln.reset()
    out = kiln.explain(fn)(*args)
    return out.graph_count, out.graph_break_count, out.break_reasons


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_multihead_attention_is_one_graph_and_matches_eager(batch_first, need_weights, train):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first).train(train)
    # non-contiguous query; key and value shared, as self-attention passes them
    q = torch.randn(5, 2, 32).transpose(0, 1) if batch_first else torch.randn(2, 5, 32).transpose(0, 1)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True  # padding on the second sequence

    def f(q):
        out, weights = m(q, q, q, key_padding_mask=mask, need_weights=need_weights)
        return out if weights is None else (out, weights)
    assert _counts(f, q)[:2] == (1, 0), _counts(f, q)[2]
    kiln.reset()
    c = kiln.compile(f)
    got, want = c(q), f(q)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if train:
        loss = lambda r: (r if isinstance(r, torch.Tensor) else r[0]).pow(2).sum()  # noqa: E731
        want_grads = torch.autograd.grad(loss(f(q)), list(m.parameters()))
        got_grads = torch.autograd.grad(loss(c(q)), list(m.parameters()))
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["eager_runs"] == 0


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inference_under_no_grad_traces_the_composite_not_the_fused_kernel(dtype, need_weights):
    # no gradient is needed, so a fallback node could hold the call; it is traced instead
    # (values_callables.TRACED_WITHOUT_GRAD), so kiln fuses the projections' epilogues and
    # calls SDPA itself: the fallback cost torchvision's ViT-B/16 inference 0.83x of inductor
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(32, 4, batch_first=True).to(dtype).eval()
    x = torch.randn(2, 5, 32, dtype=dtype).transpose(0, 1).contiguous().transpose(0, 1)
    with torch.no_grad():
        f = lambda x: m(x, x, x, need_weights=need_weights)  # noqa: E731 - eager's fused fast path
        assert _counts(f, x)[:2] == (1, 0)
        kiln.reset()
        report = str(kiln.explain(f)(x))
        assert "core.fallback" not in report, report
        assert ("core.sdpa" in report) == (not need_weights), report
        kiln.reset()
        got, want = kiln.compile(f)(x), f(x)
        assert_close(got[0], want[0], dtype)
        # (strides: eager's fused fast path returns [B, T, E] contiguous, the composite kiln
        # traces returns it as a transposed view of [T, B, E]; same values, another layout)
        if need_weights:
            assert_close(got[1], want[1], dtype)
        assert kiln.stats()["eager_runs"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformer_encoder_layer(dtype):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(dtype).eval()
    x = torch.randn(2, 6, 32, dtype=dtype)
    with torch.no_grad():
        assert _counts(layer, x)[:2] == (1, 0), _counts(layer, x)[2]
        kiln.reset()
        assert_close(kiln.compile(layer)(x), layer(x), dtype)
