"""transformers' state-space decoders (Mamba, FalconMamba) from tiny configs with random weights.

Under compilation their mixer builds its activation through ``ACT2FN[...]`` (an OrderedDict
subclass whose ``__getitem__`` instantiates a module) and scans with torch's
``associative_scan`` (``is_torchdynamo_compiling()`` is True in a trace), where eager loops over
the sequence. Dynamo's counts (torch 2.13 CPU, transformers 5.25, these configs): 1 graph /
0 breaks; kiln had 13 graphs / 13 breaks before both were captured (issue 25).

Checked: graph/break counts for inference (with transformers' default cache) and a training
forward; the full kiln backend's outputs and one training step's gradients against eager; a
prefill and a one-token decode step through the cache, logits and cache states as eager's.
"""
import pytest
import torch

import kiln
from model_helpers import check_inference, check_training, counts, tensors_of
from testing import assert_close

transformers = pytest.importorskip("transformers")
T = transformers

_SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, state_size=8, num_hidden_layers=2)
FAMILIES = {
    "mamba": lambda: T.MambaForCausalLM(T.MambaConfig(**_SMALL)),
    "falcon_mamba": lambda: T.FalconMambaForCausalLM(T.FalconMambaConfig(**_SMALL)),
}


def _model(name):
    torch.manual_seed(0)
    return FAMILIES[name]()


def _ids(seq=8):
    return torch.randint(0, 128, (2, seq))


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_one_graph_as_dynamo(name, train):
    model = _model(name)
    ids = _ids()
    with torch.set_grad_enabled(train):
        graphs, breaks, reasons = counts(model, (ids,), {"labels": ids} if train else {}, train=train)
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.parametrize("name", list(FAMILIES))
def test_inference_matches_eager(name):
    check_inference(_model(name), (_ids(),), {})


@pytest.mark.parametrize("name", list(FAMILIES))
def test_training_step_matches_eager(name):
    ids = _ids()
    check_training(_model(name), (ids,), {"labels": ids})


@pytest.mark.parametrize("name", list(FAMILIES))
def test_prefill_then_decode_through_the_cache(name):
    """The conv and recurrent states the cache carries (written in place at decode) as eager's."""
    model = _model(name).eval()
    ids, step = _ids(), torch.randint(0, 128, (2, 1))
    kiln.reset()
    compiled = kiln.compile(model)
    with torch.no_grad():
        want = model(ids, use_cache=True)
        got = compiled(ids, use_cache=True)
        assert_close(got.logits, want.logits)
        want = model(step, cache=want.cache, use_cache=True)
        got = compiled(step, cache=got.cache, use_cache=True)
    assert_close(got.logits, want.logits)
    states, expected = tensors_of(got.cache), tensors_of(want.cache)
    assert len(states) == len(expected) > 0
    for a, e in zip(states, expected):
        assert_close(a, e)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_runs"] == 0, stats
