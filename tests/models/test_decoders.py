"""transformers' decoder LLMs, as a new user runs them: each family from a tiny config with
random weights (no downloads), in one graph with no break, as torch.compile captures them.

- graph/break counts from ``kiln.explain(backend="eager")``, for inference and for a training
  forward (``model.train()`` with every dropout of the config on, labels given);
- the full kiln backend (C++ kernels) for inference and one training step: outputs, the loss and
  the gradient of every parameter against eager. Dropout is 0 there, since kiln's random
  stream is not eager's (as under torch.compile); the counts above cover dropout on.

Dynamo's counts (``torch._dynamo.explain`` on torch 2.13 CPU, transformers 5.24, these configs):
1 graph / 0 breaks for every family, except GPT-2 with labels (inference and training) and GPT-2
in training mode: 2 graphs / 1 break (``logger.warning_once`` in ``loss_function``), which kiln
replays after the graph instead of breaking.
"""
import pytest
import torch

import kiln
from testing import assert_close

transformers = pytest.importorskip("transformers")
T = transformers

VOCAB, SEQ = 128, 8
_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")
_LLAMA_LIKE = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                   bos_token_id=0, eos_token_id=0, pad_token_id=0)

FAMILIES = {
    "llama": lambda kw: T.LlamaForCausalLM(T.LlamaConfig(**_LLAMA_LIKE, **kw)),
    "mistral": lambda kw: T.MistralForCausalLM(T.MistralConfig(**_LLAMA_LIKE, **kw)),
    "qwen2": lambda kw: T.Qwen2ForCausalLM(T.Qwen2Config(**_LLAMA_LIKE, **kw)),
    "gemma": lambda kw: T.GemmaForCausalLM(T.GemmaConfig(head_dim=8, **_LLAMA_LIKE, **kw)),
    "phi3": lambda kw: T.Phi3ForCausalLM(T.Phi3Config(**_LLAMA_LIKE, **kw)),
    "gpt_neox": lambda kw: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, **kw)),
    "gpt2": lambda kw: T.GPT2LMHeadModel(T.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
        eos_token_id=0, **kw)),
}
# GPT-2 also with labels= (the loss in the model: transformers' loss_function property)
CASES = [(name, False) for name in FAMILIES] + [("gpt2", True)]
IDS = [f"{n}-labels" if labels else n for n, labels in CASES]


def _model(name, dropout):
    cfg_fields = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
                  "phi3": ("resid_pdrop", "embd_pdrop", "attention_dropout"),
                  "gpt_neox": ("attention_dropout", "hidden_dropout")}.get(name, ("attention_dropout",))
    assert set(cfg_fields) <= set(_DROPOUT_FIELDS)
    torch.manual_seed(0)
    return FAMILIES[name]({f: dropout for f in cfg_fields})


def _inputs(labels):
    ids = torch.randint(0, VOCAB, (2, SEQ))
    return (ids,), ({"labels": torch.randint(0, VOCAB, (2, SEQ))} if labels else {})


def _assert_one_graph(model, args, kwargs):
    out = kiln.explain(model, backend="eager")(*args, **kwargs)
    reasons = [str(b) for b in out.break_reasons]
    assert (out.graph_count, out.graph_break_count) == (1, 0), reasons


@pytest.mark.parametrize("name,labels", CASES, ids=IDS)
def test_one_graph_inference(name, labels):
    kiln.reset()
    args, kwargs = _inputs(labels)
    with torch.no_grad():
        _assert_one_graph(_model(name, 0.0).eval(), args, kwargs)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_one_graph_with_padding_mask(name):
    """A left-padded batch (the tokenizer's attention_mask): masking_utils builds the 4-D mask
    by indexing the padding mask with broadcast index tensors; one graph, logits as eager's."""
    kiln.reset()
    model = _model(name, 0.0).eval()
    (ids,), _ = _inputs(False)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        _assert_one_graph(model, (ids,), {"attention_mask": mask})
        kiln.reset()
        compiled = kiln.compile(model, backend="eager")
        assert_close(compiled(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("name,labels", CASES, ids=IDS)
def test_one_graph_training_with_dropout(name, labels):
    kiln.reset()
    args, kwargs = _inputs(labels)
    _assert_one_graph(_model(name, 0.1).train(), args, kwargs)


def _loss(out, labels):
    return out.loss if labels else out.logits.float().pow(2).mean()


@pytest.mark.parametrize("name,labels", CASES, ids=IDS)
def test_kiln_inference_and_training_step(name, labels):
    """Full backend: inference logits, then a training step's loss and every gradient."""
    kiln.reset()
    model = _model(name, 0.0)
    compiled = kiln.compile(model)
    args, kwargs = _inputs(labels)
    with torch.no_grad():
        model.eval()
        assert_close(compiled(*args, **kwargs).logits, model(*args, **kwargs).logits)
    model.train()
    want = _loss(model(*args, **kwargs), labels)
    want.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    got = _loss(compiled(*args, **kwargs), labels)
    got.backward()
    assert_close(got, want)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys()
    for n in expected:  # gradients of one fused backward vs eager's per-op rounding
        torch.testing.assert_close(grads[n], expected[n], rtol=1e-4, atol=1e-5, msg=n)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats
    assert stats["kernels_generated"] > 0, stats  # the layers ran in generated kernels


def test_break_inside_every_layer_resumes_compiled(monkeypatch, capsys):
    """A break in each decoder layer's MLP (inside the layer loop, under transformers' nested
    decorators) resumes in compiled code at every level: no part of the model runs eagerly."""
    from transformers.models.llama import modeling_llama

    mlp_forward = modeling_llama.LlamaMLP.forward

    def breaking_forward(self, x):
        kiln.graph_break()
        return mlp_forward(self, x)

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", breaking_forward)
    model = _model("llama", 0.0).eval()
    args, _ = _inputs(False)
    kiln.log.configure("graph_breaks")
    try:
        compiled = kiln.compile(model, backend="eager")
        with torch.no_grad():
            assert_close(compiled(*args).logits, model(*args).logits)
    finally:
        kiln.log.configure("")
    logged = capsys.readouterr().err
    assert "resumes compiled" in logged and "eagerly" not in logged, logged
    assert kiln.stats()["graph_breaks"] > 0


def test_break_inside_kernelized_attention_resumes_compiled(monkeypatch, capsys):
    """A break inside LlamaAttention, which transformers wraps with the kernels package's
    use_kernelized_func (its forward stores ``Func.forward`` functions in a context holder,
    and Func.forward carries the kernel's ``__signature__``): every level resumes compiled."""
    from transformers.models.llama import modeling_llama

    attention = modeling_llama.eager_attention_forward

    def breaking_attention(*args, **kwargs):
        kiln.graph_break()
        return attention(*args, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", breaking_attention)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**_LLAMA_LIKE, attn_implementation="eager")).eval()
    args, _ = _inputs(False)
    kiln.log.configure("graph_breaks")
    try:
        compiled = kiln.compile(model, backend="eager")
        with torch.no_grad():
            assert_close(compiled(*args).logits, model(*args).logits)
    finally:
        kiln.log.configure("")
    logged = capsys.readouterr().err
    assert "resumes compiled" in logged and "eagerly" not in logged, logged
    assert kiln.stats()["eager_runs"] == 0


def test_kiln_training_step_with_dropout_on():
    """GPT-2's dropouts (embeddings, attention weights, residuals) on, full backend: one graph,
    a loss near eager's (dropout changes it a little), every parameter gets a finite gradient,
    and the same seed gives the same loss twice (kiln's own random stream)."""
    model = _model("gpt2", 0.1).train()
    args, kwargs = _inputs(True)
    compiled = kiln.compile(model)
    losses = []
    for _ in range(2):
        torch.manual_seed(1)
        model.zero_grad(set_to_none=True)
        loss = compiled(*args, **kwargs).loss
        loss.backward()
        losses.append(loss.detach())
    assert_close(losses[0], losses[1])
    with torch.no_grad():
        plain = model.eval()(*args, **kwargs).loss
    assert abs(losses[0].item() - plain.item()) < 0.5, (losses, plain)
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats
