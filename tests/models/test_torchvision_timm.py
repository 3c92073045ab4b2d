"""torchvision's and timm's classifiers (random weights, batch 2 at 32x32): kiln's graph and
break counts against Dynamo's (read live with ``torch._dynamo.explain``), inference and a
training step against eager.

torchvision from the registry does not load against this host's CPU torch and timm needs it,
so these run on the device machine (which has both) and skip here. The sizes are small for the
device's CPU (the tests run there on the CPU like the rest of the suite); the transformer-style
models take ``image_size``/``img_size`` 32 so their patch grids fit."""
import pytest
import torch

from model_helpers import check_inference, check_training, counts

torchvision = pytest.importorskip("torchvision", exc_type=ImportError)

TV = {  # name -> extra constructor arguments
    "resnet50": {}, "mobilenet_v3_large": {}, "efficientnet_b0": {}, "convnext_tiny": {},
    "vit_b_16": {"image_size": 32}, "swin_t": {}, "densenet121": {},
}
TIMM = {
    "regnety_016": {}, "deit_tiny_patch16_224": {"img_size": 32}, "mixer_s16_224": {"img_size": 32},
    "efficientnet_b0": {}, "convnext_atto": {},
}
# gradients that fp32 rounding makes ill-conditioned (train-mode batch norms over a batch of 2):
# compared against a float64 run, as tests/models/test_vision.py's MobileNetV2
BATCH_NORMED = {"tv_resnet50", "tv_mobilenet_v3_large", "tv_efficientnet_b0", "tv_densenet121",
                "timm_regnety_016", "timm_efficientnet_b0"}
NAMES = [f"tv_{n}" for n in TV] + [f"timm_{n}" for n in TIMM]


def _build(name):
    torch.manual_seed(0)
    if name.startswith("tv_"):
        arch = name[3:]
        model = torchvision.models.get_model(arch, weights=None, **TV[arch])
    else:
        timm = pytest.importorskip("timm")
        arch = name[5:]
        model = timm.create_model(arch, pretrained=False, **TIMM[arch])
    for m in model.modules():  # stochastic depth and dropout off: the comparison is exact
        if hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model, (torch.randn(2, 3, 32, 32),), {}


def _dynamo_counts(model, args, train):
    import torch._dynamo  # the peer's figure, read by the test only

    from model_helpers import loss_of
    model.train(train)
    torch._dynamo.reset()
    fn = (lambda *a: loss_of(model(*a))) if train else model
    out = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return out.graph_count, out.graph_break_count


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", NAMES)
def test_breaks_against_dynamo(name, train):
    model, args, kwargs = _build(name)
    graphs, breaks = _dynamo_counts(model, args, train)
    k_graphs, k_breaks, reasons = counts(model, args, kwargs, train=train)
    if breaks == 0:
        assert (k_graphs, k_breaks) == (1, 0), reasons
    else:
        assert k_breaks <= breaks, (k_breaks, breaks, reasons)


@pytest.mark.parametrize("name", NAMES)
def test_inference_matches_eager(name):
    model, args, kwargs = _build(name)
    check_inference(model, args, kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_training_step_matches_eager(name):
    model, args, kwargs = _build(name)
    check_training(model, args, kwargs,
                   reference="float64" if name in BATCH_NORMED else "eager")
