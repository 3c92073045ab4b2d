"""Small transformers models from configs (random weights, no downloads) and the checks the
model tests share: graph and break counts under kiln.explain, outputs and gradients against
eager."""
from __future__ import annotations

import pytest
import torch

import kiln
from testing import assert_close

transformers = pytest.importorskip("transformers")


def tensors_of(out):
    """Every tensor in a model's output (ModelOutput fields, tuples, caches' layers), in order."""
    found = []

    def walk(v, depth=0):
        if depth > 6:
            return
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x, depth + 1)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x, depth + 1)
        elif hasattr(v, "__dict__") and not isinstance(v, torch.nn.Module):
            for x in vars(v).values():
                walk(x, depth + 1)
    walk(out)
    return found


def _plain_tensors(v, found):
    if isinstance(v, torch.Tensor):
        found.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _plain_tensors(x, found)
    elif isinstance(v, (tuple, list)):
        for x in v:
            _plain_tensors(x, found)
    return found


def loss_of(out):
    """A scalar that every floating output field feeds (for a training step; a cache object in
    the output is left out)."""
    total = 0
    for t in _plain_tensors(out, []):
        if t.is_floating_point() and t.requires_grad:
            total = total + (t.float() * torch.linspace(0.5, 1.5, t.numel()).view(t.shape)).sum()
    return total


def explain_of(model, args, kwargs, train=False):
    """kiln.explain of the model (a training step: its loss) with the eager backend (capture only)."""
    model.train(train)
    kiln.reset()
    if train:
        def step(*a, **k):
            return loss_of(model(*a, **k))
        return kiln.explain(step, backend="eager")(*args, **kwargs)
    return kiln.explain(model, backend="eager")(*args, **kwargs)


def counts(model, args, kwargs, train=False):
    """(graphs, breaks, reasons) of kiln.explain with the eager backend (capture only)."""
    out = explain_of(model, args, kwargs, train)
    for b in out.break_reasons:
        assert b.reason and b.lineno, b  # every break says why and where
    return out.graph_count, out.graph_break_count, [b.reason for b in out.break_reasons]


def check_inference(model, args, kwargs, backend="kiln"):
    """Compiled outputs equal eager's, for two calls (the second a cache hit)."""
    model.eval()
    kiln.reset()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            expected = tensors_of(model(*args, **kwargs))
            actual = tensors_of(compiled(*args, **kwargs))
            assert len(actual) == len(expected) > 0
            for a, e in zip(actual, expected):
                assert_close(a, e)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["recompiles"] == 0, stats
    return stats


def check_training(model, args, kwargs, backend="kiln", reference="eager"):
    """One training step: the loss and the gradient of every parameter equal eager's.

    ``reference="float64"`` is for a model whose fp32 gradients are ill-conditioned (MobileNetV2:
    sixteen train-mode batch norms over a batch of 2, gradients up to 1e5): each compiled
    gradient must be no further from a float64 eager run than eager's own fp32 gradient is
    (measured: kiln's error is 0.3-1x eager's; against each other they differ by ~4%)."""
    model.train()
    kiln.reset()
    params = [p for p in model.parameters() if p.requires_grad]

    def step(*a, **k):
        return loss_of(model(*a, **k))
    model.zero_grad(set_to_none=True)
    expected = step(*args, **kwargs)
    expected.backward()
    want = [None if p.grad is None else p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    actual = kiln.compile(step, backend=backend)(*args, **kwargs)
    actual.backward()
    if reference == "float64":  # the loss too: a batch norm over 2 values rounds it as freely
        return _against_float64(model, params, want, step, args, kwargs,
                                losses=(actual.detach(), expected.detach()))
    assert_close(actual.detach(), expected.detach())
    checked = 0
    for p, w in zip(params, want):
        if w is None:
            assert p.grad is None or not p.grad.any()
            continue
        scale = max(1.0, w.abs().max().item())  # fused kernels round differently: relative to the gradient's size
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-5 * scale)
        checked += 1
    assert checked > 0
    stats = kiln.stats()
    assert stats["fallbacks"] == 0, stats
    return stats


# ---------------------------------------------------------------- small configs
def _ids(lo=0, shape=(2, 8)):
    return torch.randint(lo, 128, shape)


def _masked_labels(ids):
    """Labels for a language-model loss: the ids, every third position ignored (-100)."""
    return torch.where(torch.arange(ids.numel()).view(ids.shape) % 3 == 1, -100, ids)


TEXT = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


def build(name, dropout=0.0, attn=None):
    """(model, args, kwargs) for a model family member, seeded; ``attn`` picks the attention
    implementation of the text encoders (transformers' default is sdpa)."""
    T = transformers
    torch.manual_seed(0)
    text = dict(TEXT, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    seq2seq = dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                   decoder_ffn_dim=64, dropout=dropout, attention_dropout=dropout,
                   activation_dropout=dropout)
    if attn is not None:
        text["attn_implementation"] = attn
    if name == "bert":
        return T.BertModel(T.BertConfig(**text)), (_ids(),), {}
    if name == "roberta":
        return T.RobertaModel(T.RobertaConfig(**text, pad_token_id=1)), (_ids(2),), {}
    if name == "distilbert":
        cfg = T.DistilBertConfig(vocab_size=128, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                 max_position_embeddings=32, dropout=dropout, attention_dropout=dropout)
        return T.DistilBertModel(cfg), (_ids(),), {}
    if name == "albert":
        return T.AlbertModel(T.AlbertConfig(embedding_size=16, **text)), (_ids(),), {}
    if name == "electra":
        return T.ElectraModel(T.ElectraConfig(embedding_size=16, **text)), (_ids(),), {}
    if name == "bert_mlm":  # a head that builds its loss module in forward (CrossEntropyLoss())
        ids = _ids()
        return T.BertForMaskedLM(T.BertConfig(**text)), (ids,), dict(labels=_masked_labels(ids))
    if name == "bert_cls":
        model = T.BertForSequenceClassification(T.BertConfig(**text, num_labels=3))
        return model, (_ids(),), dict(labels=torch.tensor([2, 0]))
    if name == "t5_lm":
        cfg = T.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         dropout_rate=dropout, decoder_start_token_id=0)
        labels = _masked_labels(_ids(shape=(2, 6)))
        return T.T5ForConditionalGeneration(cfg), (), dict(input_ids=_ids(), labels=labels)
    if name == "t5":
        cfg = T.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         dropout_rate=dropout, decoder_start_token_id=0)
        return T.T5Model(cfg), (), dict(input_ids=_ids(), decoder_input_ids=_ids(shape=(2, 6)))
    if name == "bart":
        return T.BartModel(T.BartConfig(max_position_embeddings=32, **seq2seq)), (_ids(3),), {}
    if name == "whisper":
        cfg = T.WhisperConfig(num_mel_bins=16, max_source_positions=16, max_target_positions=32,
                              pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              decoder_start_token_id=1, **seq2seq)
        return T.WhisperModel(cfg), (torch.randn(2, 16, 32),), dict(decoder_input_ids=_ids(shape=(2, 6)))
    return build_vision(name, dropout)


def build_vision(name, dropout=0.0):
    T = transformers
    image = (torch.randn(2, 3, 32, 32),)
    if name == "vit":
        cfg = T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=dropout,
                          attention_probs_dropout_prob=dropout)
        return T.ViTModel(cfg), image, {}
    if name == "swin":
        cfg = T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                           window_size=4, drop_path_rate=0.0, hidden_dropout_prob=dropout,
                           attention_probs_dropout_prob=dropout)
        return T.SwinModel(cfg), image, {}
    if name == "convnext":
        cfg = T.ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], drop_path_rate=0.0)
        return T.ConvNextModel(cfg), image, {}
    if name == "clip":
        cfg = T.CLIPConfig(
            text_config=dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=16, bos_token_id=0,
                             eos_token_id=2, pad_token_id=1, attention_dropout=dropout),
            vision_config=dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, attention_dropout=dropout),
            projection_dim=16)
        return T.CLIPModel(cfg), (), dict(input_ids=_ids(3), pixel_values=image[0])
    if name == "resnet":
        cfg = T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
        return T.ResNetModel(cfg), image, {}
    if name == "regnet":
        cfg = T.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8)
        return T.RegNetModel(cfg), image, {}
    if name == "mobilenet":
        cfg = T.MobileNetV2Config(image_size=32, depth_multiplier=0.25, classifier_dropout_prob=dropout)
        return T.MobileNetV2Model(cfg), image, {}
    raise KeyError(name)


def _against_float64(model, params, want, step, args, kwargs, losses):
    import copy
    got = [p.grad for p in params]
    wide = copy.deepcopy(model).double()
    wide_args = [a.double() if a.is_floating_point() else a for a in args]
    wide.zero_grad(set_to_none=True)
    loss = 0
    for t in _plain_tensors(wide(*wide_args, **kwargs), []):
        if t.is_floating_point() and t.requires_grad:
            loss = loss + (t * torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype).view(t.shape)).sum()
    loss.backward()
    ours, eager = (abs(x.double().item() - loss.item()) for x in losses)
    assert ours <= 2 * eager + 1e-5 * max(1.0, abs(loss.item())), (losses, loss.item())
    for g, w, ref in zip(got, want, [p.grad for p in wide.parameters() if p.requires_grad]):
        if ref is None:
            continue
        ours = (g.double() - ref).abs().max().item()
        eager = (w.double() - ref).abs().max().item()
        scale = ref.abs().max().item()
        # a gradient that is zero in exact arithmetic (a batch norm's bias feeding another train-
        # mode batch norm: ~1e-12 in float64) is rounding noise in both fp32 runs
        factor = 2 if scale > eager else 10
        assert ours <= factor * eager + 1e-5 * max(1.0, scale), (ours, eager, scale)
    return kiln.stats()
