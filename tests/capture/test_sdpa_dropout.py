"""scaled_dot_product_attention with dropout_p > 0 (train-mode encoders): captured in core ops
(torch's math path with dropout on the probabilities), no break."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def attention(q, k, v, p, mask, causal):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)


def _masks():
    keep = torch.rand(5, 5) > 0.3
    keep[:, 0] = True
    return [(None, False), (keep, False), (torch.randn(2, 1, 5, 5), False), (None, True)]


@pytest.mark.parametrize("case", range(4), ids=["none", "bool", "float", "causal"])
def test_sdpa_dropout_is_captured_and_matches_eager_at_the_limits(case):
    mask, causal = _masks()[case]
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    explained = kiln.explain(attention, backend="eager")(q, k, v, 0.5, mask, causal)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = kiln.compile(attention)
    # p = 1 drops everything (as eager); p ~ 0 keeps everything, scaled by 1 / (1 - p)
    torch.testing.assert_close(compiled(q, k, v, 1.0, mask, causal), attention(q, k, v, 1.0, mask, causal))
    p = 1e-7
    out = compiled(q, k, v, p, mask, causal)
    want = attention(q, k, v, 0.0, mask, causal) / (1 - p)
    torch.testing.assert_close(out, want)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    expected = torch.autograd.grad(want.sum(), (q, k, v))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_sdpa_dropout_drops_about_p_of_the_probabilities():
    # uniform attention (q = k = 0) over 64 keys, v = identity: each output entry is 0 (dropped)
    # or 2 / 64 (kept, scaled by 1 / (1 - 0.5))
    q = k = torch.zeros(1, 1, 64, 8)
    v = torch.eye(64).view(1, 1, 64, 64)
    out = kiln.compile(attention)(q, k, v, 0.5, None, False)
    kept = (out > 0).float().mean().item()
    assert 0.4 < kept < 0.6, kept
    torch.testing.assert_close(out[out > 0], torch.full_like(out[out > 0], 2 / 64))
