"""Vision models from transformers (ViT, Swin, ConvNeXt, CLIP, ResNet, RegNet, MobileNetV2),
small configs with random weights, 32x32 images: one graph with no break, as under
torch.compile, for inference and for a training step; outputs and gradients equal eager's.

What they need: Swin's pooler (``AdaptiveAvgPool1d``), CLIP's text pooling
(``h[torch.arange(b), ids.argmax(-1)]``, two index tensors), train-mode batch norms.

Dynamo's counts (torch._dynamo.explain, torch 2.13, transformers 5.24, these configs, measured
once): 1 graph / 0 breaks for each model, inference and training."""
import pytest

from model_helpers import build, check_inference, check_training, counts

MODELS = ["vit", "swin", "convnext", "clip", "resnet", "regnet", "mobilenet"]
DYNAMO = {name: (1, 0) for name in MODELS}


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", MODELS)
def test_one_graph(name, train):
    model, args, kwargs = build(name)
    graphs, breaks, reasons = counts(model, args, kwargs, train=train)
    assert (graphs, breaks) == DYNAMO[name], reasons


@pytest.mark.parametrize("name", ["vit", "clip"])
def test_inference_matches_eager(name):
    model, args, kwargs = build(name)
    check_inference(model, args, kwargs)


@pytest.mark.parametrize("name", ["swin", "convnext", "resnet", "regnet", "mobilenet"])
def test_inference_matches_eager_capture_only(name):
    model, args, kwargs = build(name)
    check_inference(model, args, kwargs, backend="aot_eager")


def test_vit_training_step_matches_eager():
    model, args, kwargs = build("vit")
    check_training(model, args, kwargs)


@pytest.mark.parametrize("name", ["swin", "clip", "resnet"])
def test_training_step_matches_eager_capture_and_autograd(name):
    model, args, kwargs = build(name)
    check_training(model, args, kwargs, backend="aot_eager")


def test_mobilenet_training_step_against_float64():
    model, args, kwargs = build("mobilenet")
    check_training(model, args, kwargs, backend="aot_eager", reference="float64")
