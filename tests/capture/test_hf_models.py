"""Real model code nobody on the team wrote: transformers' GPT-2 and ResNet, from tiny configs
with random weights, compiled and compared with eager. Graph and break counts are printed and
asserted (each break has a reason; see the module's notes in docs/architecture.md)."""
import pytest
import torch

import kiln
from testing import assert_close

transformers = pytest.importorskip("transformers")

# (graphs, breaks) per model, as kiln.explain reports them today
EXPECTED = {
    # GPT-2 is one graph: the output-capturing wrapper's `_CAN_RECORD_REGISTRY.get(self)` (a dict
    # subclass), the cache's per-layer config view (a collections.abc.Sequence), the config's
    # attribute_map (__getattribute__) and the attention interfaces (MutableMappings) all capture
    "gpt2-eager": (1, 0),
    # sdpa: transformers' sdpa_attention_forward asks torch whether another tracer is running
    # (is_tracing / is_scripting: False under kiln, capture/builtins.py _torch_tracing_queries)
    "gpt2-sdpa": (1, 0),
    "resnet": (1, 0),
    "resnet-classifier": (1, 0),
}


def _gpt2(attn):
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _resnet(head):
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                                    depths=[1, 1], layer_type="basic", num_labels=5)
    torch.manual_seed(0)
    cls = transformers.ResNetForImageClassification if head else transformers.ResNetModel
    return cls(cfg).eval()


def _counts(name, model, *args):
    out = kiln.explain(model, backend="eager")(*args)
    print(f"{name}: {out.graph_count} graphs, {out.graph_break_count} breaks")
    for b in out.break_reasons:
        print(f"  break: {b}")
        assert b.reason and b.lineno, b  # every break says why and where
    return out


def _check(name, model, args, field):
    explained = _counts(name, model, *args)
    want = EXPECTED[name]
    if want is not None:
        assert (explained.graph_count, explained.graph_break_count) == want
    kiln.reset()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for _ in range(2):  # the second call is a cache hit
            fresh = tuple(a.clone() for a in args)
            expected = getattr(model(*fresh), field)
            actual = getattr(compiled(*fresh), field)
            assert_close(actual, expected)
    stats = kiln.stats()  # nothing ran eagerly behind the counts (a callee, a resume function)
    assert stats["graph_breaks"] == want[1] and stats["fallbacks"] == 0, stats
    assert stats["recompiles"] == 0, stats
    if want[1] == 0:
        assert stats["frames_compiled"] == 1, stats


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2(attn):
    model = _gpt2(attn)
    ids = torch.randint(0, 128, (2, 8))
    _check(f"gpt2-{attn}", model, (ids,), "logits")


@pytest.mark.parametrize("head", [False, True], ids=["resnet", "resnet-classifier"])
def test_resnet(head):
    model = _resnet(head)
    x = torch.randn(2, 3, 32, 32)
    _check("resnet-classifier" if head else "resnet", model, (x,),
           "logits" if head else "last_hidden_state")
