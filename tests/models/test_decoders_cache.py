"""transformers' decoders with a KV cache, called the way generation calls them (issue 25): a
prefill with ``use_cache=True``, decode steps of one token with the returned DynamicCache,
``model.generate`` with a compiled forward, and decoder layers compiled one by one (or reached
as frames of their own through a graph break), whose shared code indexes ``cache.layers`` with
each layer's ``layer_idx``. Tiny configs, random weights; every logit, cache tensor and token is
compared with eager.

Dynamo's figures on these configs (torch 2.13 CPU, transformers 5.24, backend="eager"):
prefill with use_cache=True: 1 graph, 0 breaks; the compiled forward in generate(8 tokens):
3 frames (prefill, first decode step, then the cache length dynamic); each layer compiled on
its own: the recompile limit (8) is hit (one entry per layer_idx and step shape).
"""
import pytest
import torch

import kiln
from testing import TOLERANCES


def assert_close(a, b, msg=None):
    rtol, atol = TOLERANCES.get(b.dtype, (0, 0))
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=msg)

transformers = pytest.importorskip("transformers")
T = transformers

VOCAB = 128
_LLAMA = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _model(name, layers=2, **kw):
    torch.manual_seed(0)
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers, n_head=2, n_embd=32, vocab_size=VOCAB,
                                              n_positions=64, bos_token_id=0, eos_token_id=0, **kw)).eval()
    return T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=layers, **_LLAMA, **kw)).eval()


def _layers(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def _ids(seq=8):
    torch.manual_seed(3)
    return torch.randint(1, VOCAB, (2, seq))


def _assert_same_cache(got, want):
    assert type(got) is type(want) and len(got.layers) == len(want.layers)
    for i, (a, b) in enumerate(zip(got.layers, want.layers)):
        assert_close(a.keys, b.keys, msg=f"layer {i} keys")
        assert_close(a.values, b.values, msg=f"layer {i} values")


def _quiet_stats():
    s = kiln.stats()
    assert s["eager_runs"] == 0 and s["fallbacks"] == 0, s  # no part ran eagerly
    return s


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_prefill_with_use_cache_is_one_graph_as_dynamo(name):
    model = _model(name)
    ids = _ids()
    with torch.no_grad():
        kiln.reset()
        out = kiln.explain(model, backend="eager")(ids, use_cache=True)
        assert (out.graph_count, out.graph_break_count) == (1, 0), [str(b) for b in out.break_reasons]
        dyn = torch._dynamo.explain(model)(ids, use_cache=True)
        assert dyn.graph_break_count == 0  # the peer's figure on the same call


@pytest.mark.parametrize("name,backend", [("gpt2", "eager"), ("llama", "eager"), ("gpt2", "kiln")])
def test_decode_steps_compile_once_then_stay_dynamic(name, backend):
    """Prefill, then six decode steps of one token with the growing cache: the prefill, the
    first step and the second (the cache length now dynamic) compile; later steps hit."""
    kiln.reset()
    model = _model(name)
    compiled = kiln.compile(model, backend=backend)
    ids = _ids()
    with torch.no_grad():
        got, want = compiled(ids, use_cache=True), model(ids, use_cache=True)
        assert_close(got.logits, want.logits)
        _assert_same_cache(got.past_key_values, want.past_key_values)
        for step in range(6):
            token = want.logits[:, -1:].argmax(-1)
            got = compiled(token, past_key_values=got.past_key_values, use_cache=True)
            want = model(token, past_key_values=want.past_key_values, use_cache=True)
            assert_close(got.logits, want.logits, msg=f"step {step}")
            _assert_same_cache(got.past_key_values, want.past_key_values)
            assert got.past_key_values.layers[0].keys.shape[2] == 9 + step
    s = _quiet_stats()
    assert s["graph_breaks"] == 0 and s["frames_compiled"] == 3 and s["recompiles"] == 2, s


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_with_a_compiled_forward(name):
    """Greedy generate(8 tokens) with model.forward compiled: eager's tokens, 3 compiles (the
    same figure as torch.compile's frames on this call)."""
    kiln.reset()
    model = _model(name)
    ids = _ids()
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        model.forward = kiln.compile(model.forward, backend="eager")
        got = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert got.tolist() == want.tolist()
    s = _quiet_stats()
    assert s["graph_breaks"] == 0 and s["frames_compiled"] == 3, s


@pytest.mark.parametrize("name,kw", [("gpt2", {}), ("llama", {}),
                                     # a Python float per layer (scaling / (layer_idx + 1))
                                     ("gpt2", {"scale_attn_by_inverse_layer_idx": True})],
                         ids=["gpt2", "llama", "gpt2-float-per-layer"])
def test_layers_compiled_one_by_one_share_entries(name, kw):
    """Each of 10 decoder layers wrapped by kiln.compile, then generate(8 tokens): the layers'
    shared code indexes the cache with its layer_idx, a symbol after its first change, so all
    layers share one entry per step shape (4 compiles: layer_idx 0 in the prefill, the
    prefill's symbolic entry, the first decode step, the dynamic cache length). Before: one
    entry per layer and step shape, the recompile limit, and eager runs (Dynamo too hits it)."""
    kiln.reset()
    model = _model(name, layers=10, **kw)
    ids = _ids()
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        for layer in _layers(model):
            layer.forward = kiln.compile(layer.forward, backend="eager")
        got = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert got.tolist() == want.tolist()
    s = _quiet_stats()
    assert s["graph_breaks"] == 0 and s["frames_compiled"] == 4, s


def test_break_inside_every_layer_with_a_cache(monkeypatch):
    """A graph break in each layer's MLP during generate: the layer frames compile on their own
    (one code for all layers, indexing the cache), nothing runs eagerly, eager's tokens."""
    from transformers.models.llama import modeling_llama

    mlp_forward = modeling_llama.LlamaMLP.forward

    def breaking_forward(self, x):
        kiln.graph_break()
        return mlp_forward(self, x)

    kiln.reset()
    model = _model("llama", layers=6)
    ids = _ids()
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
        monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", breaking_forward)
        model.forward = kiln.compile(model.forward, backend="eager")
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert got.tolist() == want.tolist()
    s = _quiet_stats()
    assert s["graph_breaks"] > 0, s
