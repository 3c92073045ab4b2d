"""Encoders from transformers (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA), small configs with
random weights: one graph with no break, as under torch.compile, for inference and for a
training step; outputs and gradients equal eager's.

Dynamo's counts (torch._dynamo.explain, torch 2.13, transformers 5.24, these configs, measured
once): 1 graph / 0 breaks for each model, inference and training."""
import pytest

from model_helpers import build, check_inference, check_training, counts

MODELS = ["bert", "roberta", "distilbert", "albert", "electra"]
DYNAMO = {name: (1, 0) for name in MODELS}  # (graphs, breaks), inference and training alike


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", MODELS)
def test_one_graph(name, train):
    model, args, kwargs = build(name)
    graphs, breaks, reasons = counts(model, args, kwargs, train=train)
    assert (graphs, breaks) == DYNAMO[name], reasons


@pytest.mark.parametrize("name", ["bert", "distilbert"])
def test_inference_matches_eager(name):
    model, args, kwargs = build(name)
    check_inference(model, args, kwargs)


@pytest.mark.parametrize("name", ["roberta", "albert", "electra"])
def test_inference_matches_eager_capture_only(name):
    model, args, kwargs = build(name)
    check_inference(model, args, kwargs, backend="aot_eager")


def test_training_step_matches_eager():
    model, args, kwargs = build("bert")
    check_training(model, args, kwargs)


@pytest.mark.parametrize("name", ["distilbert", "albert"])
def test_training_step_matches_eager_capture_and_autograd(name):
    model, args, kwargs = build(name)
    check_training(model, args, kwargs, backend="aot_eager")


def test_dropout_on_compiles_in_train_mode_without_breaks():
    # sdpa attention (transformers' default) with dropout_p = 0.1: captured in core ops
    model, args, kwargs = build("bert", dropout=0.1)
    assert counts(model, args, kwargs, train=True)[:2] == (1, 0)
    model.train()
    import kiln
    kiln.reset()
    from model_helpers import loss_of
    loss = kiln.compile(lambda *a: loss_of(model(*a)))(*args)
    loss.backward()  # random masks differ from eager's: the step runs, compiled, and trains
    assert loss.isfinite()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats


def test_dropout_on_with_eager_attention():
    model, args, kwargs = build("electra", dropout=0.1, attn="eager")
    assert counts(model, args, kwargs, train=True)[:2] == (1, 0)


# Heads that build their loss module inside forward (``loss_fct = CrossEntropyLoss()``), called
# with labels. Dynamo (torch._dynamo.explain, torch 2.13, transformers 5.24): 1 graph / 0 breaks,
# inference and training.
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", ["bert_mlm", "bert_cls"])
def test_heads_with_labels_one_graph(name, train):
    model, args, kwargs = build(name)
    graphs, breaks, reasons = counts(model, args, kwargs, train=train)
    assert (graphs, breaks) == (1, 0), reasons


def test_masked_lm_training_step_with_labels_matches_eager():
    model, args, kwargs = build("bert_mlm")
    stats = check_training(model, args, kwargs)
    assert stats["graph_breaks"] == 0, stats


def test_mra_without_its_kernel_is_one_graph_under_no_grad():
    """MRA's attention returns ``torch.zeros_like(query).requires_grad_()`` when its CUDA kernel
    is missing: captured under no_grad (made_leaves.py), 1 graph / 0 breaks as Dynamo (13 / 13
    before), outputs as eager's. With grad mode on it stays a break (Dynamo: 7 / 6 in training)."""
    import torch
    import kiln
    from transformers import MraConfig, MraModel
    torch.manual_seed(0)
    cfg = MraConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    model, ids = MraModel(cfg).eval(), torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        kiln.reset()
        out = kiln.explain(model, backend="eager")(ids)
        assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
        check_inference(model, (ids,), {})
