"""Mixture-of-experts decoders and BLOOM, from tiny configs with random weights: one graph
with no break, as Dynamo captures them (torch 2.13 CPU, transformers 5.25: 1 graph / 0 breaks
each), and kiln's outputs and gradients against eager.

transformers' MoE experts (``integrations/moe.py``) sort the routed tokens (``torch.sort``),
count them per expert (``torch.histc``) and run a grouped GEMM: the sort's results are fresh
tensors by its schema (``core_fallback.returns_fresh``; an in-place ``/=`` on ``topk``'s values
broke as a possible view) and ``histc`` has a static shape (it was refused as data-dependent).
BLOOM's GELU is a custom ``torch.autograd.Function`` (``GeLUFunction``) in train mode: its
forward is inlined with grad disabled (``capture/autograd_function.py``), and in training its
backward is traced too and is the region's gradient (kiln/ops/core_autograd_function.py), so
BLOOM training is one graph with no break, as Dynamo's (it broke at every layer's GELU)."""
import pytest
import torch

import kiln
from testing import assert_close

transformers = pytest.importorskip("transformers")
T = transformers

VOCAB = 128
_SMALL = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
MOE = {
    "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **_SMALL)),
    "qwen2_moe": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, **_SMALL)),
}


def _build(name):
    torch.manual_seed(0)
    if name == "bloom":
        return T.BloomForCausalLM(T.BloomConfig(n_layer=2, hidden_size=32, n_head=4, vocab_size=VOCAB))
    return MOE[name]()


@pytest.mark.parametrize("name", [*MOE, "bloom"])
def test_inference_is_one_graph_and_matches_eager(name):
    m = _build(name).eval()
    ids = torch.randint(1, VOCAB, (2, 12))
    with torch.no_grad():
        want = m(ids).logits
        out = kiln.explain(m, backend="eager")(ids)
        assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
        got = kiln.compile(m)(ids).logits
    assert_close(got, want, torch.float32)
    assert kiln.stats()["eager_runs"] == 0


@pytest.mark.parametrize("name", [*MOE, "bloom"])
def test_training_step_is_one_graph_and_matches_eager(name):
    m = _build(name).train()
    ids = torch.randint(1, VOCAB, (2, 8))
    out = kiln.explain(m, backend="eager")(ids, labels=ids)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    if name == "bloom":  # each layer's GeLUFunction, with the user's backward as its gradient
        assert str(out.graphs[0]).count("core.autograd_function('GeLUFunction#") == 2
    kiln.reset()
    loss = kiln.compile(m)(ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    ref = m(ids, labels=ids).loss
    ref.backward()
    assert_close(loss, ref, torch.float32)
    assert grads.keys() == {n for n, p in m.named_parameters() if p.grad is not None}
    for n, p in m.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-3, atol=1e-4, msg=n)
