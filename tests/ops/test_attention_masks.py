"""SDPA masks that mask nothing are dropped (kiln/ops/attention_masks.py): an input-free mask
that is all True (or an all-zero additive one) is computed at compile time and SDPA takes
none; any other mask stays. The values (and gradients) must be eager's either way."""
import re

import pytest
import torch
import torch.nn.functional as F

import kiln

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _qkv(dtype, requires_grad=False, b=2, h=3, t=5, d=8):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, dtype=dtype) for _ in range(3))
    k = torch.randn(b, h, d, t, dtype=dtype).transpose(-1, -2)  # non-contiguous
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


def bidirectional(q, k, v):  # transformers' traced bidirectional mask: arange >= 0, expanded
    t = q.shape[2]
    idx = torch.arange(t, device=q.device)
    mask = (idx[None, None, :, None] >= 0) & (idx[None, None, None, :] >= 0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(q.shape[0], -1, t, t))


def zero_bias(q, k, v):  # an additive float mask of zeros
    t = q.shape[2]
    bias = torch.zeros(1, 1, t, t, dtype=q.dtype, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, bias)


def causal(q, k, v):  # a decoder's traced causal mask, batch- and head-expanded: is_causal
    t = q.shape[2]
    idx = torch.arange(t, device=q.device)
    mask = idx[None, None, None, :] <= idx[None, None, :, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(q.shape[0], 1, t, t))


def causal_rectangular(q, k, v):  # fewer keys than queries: torch's is_causal is top-left aligned
    qi, ki = torch.arange(q.shape[2]), torch.arange(k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ki[None, :] <= qi[:, None])


def shifted_causal(q, k, v):  # a diagonal offset (a prefix): masks something, not is_causal's
    t = q.shape[2]
    idx = torch.arange(t, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=idx[None, :] <= idx[:, None] + 1)


def window(q, k, v):  # a sliding window: kept as it is
    t = q.shape[2]
    idx = torch.arange(t, device=q.device)
    d = idx[:, None] - idx[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(d >= 0) & (d < 2))


def padded(q, k, v, keep):  # depends on an input: kept
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])


def _sdpa_causal(fn, *args):
    kiln.reset()
    src = "\n".join(str(w) for w in kiln.explain(fn)(*args).wrappers)
    return [c.split(", ")[-2] == "True" for c in re.findall(r"extern_sdpa\((.*)\)", src)]


def _sdpa_masks(fn, *args):
    kiln.reset()
    src = "\n".join(str(w) for w in kiln.explain(fn)(*args).wrappers)
    calls = re.findall(r"extern_sdpa\((.*)\)", src)
    assert calls, src
    return [not c.split(", ")[-4:-3] == ["None"] for c in calls]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn, dropped, is_causal", [(bidirectional, True, False), (zero_bias, True, False),
                                                    (causal, True, True), (shifted_causal, False, False),
                                                    (causal_rectangular, True, True), (window, False, False)],
                         ids=["bidirectional", "zero_bias", "causal", "shifted_causal", "causal_rectangular", "window"])
def test_a_mask_that_masks_nothing_is_dropped_and_a_causal_one_is_is_causal(fn, dropped, is_causal, dtype):
    q, k, v = _qkv(dtype)
    if fn is causal_rectangular:
        k, v = k[:, :, :3], v[:, :, :3]  # 5 queries, 3 keys: top-left causal
    with torch.no_grad():
        assert _sdpa_masks(fn, q, k, v) == [not dropped]
        assert _sdpa_causal(fn, q, k, v) == [is_causal]
        got = kiln.compile(fn)(q, k, v)
    want = fn(q, k, v)
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert got.stride() == want.stride() and got.dtype == want.dtype


def test_a_mask_read_from_an_input_stays():
    q, k, v = _qkv(torch.float32)
    keep = torch.ones(2, 5, dtype=torch.bool)  # all True, but an input: its values may change
    with torch.no_grad():
        assert _sdpa_masks(padded, q, k, v, keep) == [True]
        f = kiln.compile(padded)
        torch.testing.assert_close(f(q, k, v, keep), padded(q, k, v, keep))
        keep[1, 3:] = False
        torch.testing.assert_close(f(q, k, v, keep), padded(q, k, v, keep))


@pytest.mark.parametrize("fn", [bidirectional, causal, window], ids=["bidirectional", "causal", "window"])
def test_training_through_a_dropped_mask_matches_eager(fn):
    q, k, v = _qkv(torch.float32, requires_grad=True)
    out = kiln.compile(fn)(q, k, v)
    out.square().sum().backward()
    got = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v).square().sum().backward()
    for a, b in zip(got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["fallbacks"] == 0


def test_transformers_vit_runs_sdpa_without_its_traced_mask():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, num_labels=5,
                                 attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(cfg).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert _sdpa_masks(model, x) == [False, False]  # both layers' SDPA calls take no mask
        torch.testing.assert_close(kiln.compile(model)(x).logits, model(x).logits, rtol=1e-4, atol=1e-5)


def test_transformers_llama_runs_causal_sdpa_without_its_traced_mask():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        # both layers: no mask, is_causal (use_cache=False: a plain prefill over 7 tokens)
        assert _sdpa_masks(lambda i: model(i, use_cache=False).logits, ids) == [False, False]
        assert _sdpa_causal(lambda i: model(i, use_cache=False).logits, ids) == [True, True]
        got = kiln.compile(lambda i: model(i, use_cache=False).logits)(ids)
        torch.testing.assert_close(got, model(ids, use_cache=False).logits, rtol=1e-4, atol=1e-5)
    # a padded batch: the mask reads the input's attention_mask and stays
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, :2] = 0
    with torch.no_grad():
        f = lambda i, m: model(i, attention_mask=m, use_cache=False).logits  # noqa: E731
        assert _sdpa_masks(f, ids, am) == [True, True]
        torch.testing.assert_close(kiln.compile(f)(ids, am), f(ids, am), rtol=1e-4, atol=1e-5)
