"""The zoo's models: transformers families built from configs (random weights, no downloads),
torchvision classifiers (``weights=None``) and timm models (``pretrained=False``).

Each entry builds ``(module, make_inputs)`` for a device and a size: ``module(*inputs)``
returns one tensor, the logits (inference) or the loss (training, ``labels`` given where the
model computes its own loss). Sizes: "full" (CUDA: batch 32 at 224x224, or 8 x 512 tokens),
"small" (CPU), "quick" (a smoke run).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Entry:
    name: str
    group: str
    build: Callable  # (size, training) -> (module, make_inputs(device, dtype) -> tuple)
    note: str = ""


MODELS: dict[str, Entry] = {}
GROUPS: dict[str, list[str]] = {}


def _register(name, group, note=""):
    def deco(fn):
        MODELS[name] = Entry(name, group, fn, note)
        GROUPS.setdefault(group, []).append(name)
        return fn
    return deco


def no_dropout(module: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off, so a training step is a function of its inputs and
    eager, torch.compile and kiln can be compared (their random streams differ)."""
    for m in module.modules():
        kind = type(m).__name__
        if isinstance(m, nn.modules.dropout._DropoutNd) or "StochasticDepth" in kind:
            m.p = 0.0
        if "DropPath" in kind and hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    return module


def _zero_dropout_config(cfg):
    for key, value in list(vars(cfg).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key or key == "drop_path_rate"):
            setattr(cfg, key, 0.0)
    return cfg


# ----------------------------------------------------------------------------- transformers
def _with_loss_type(model):
    """The loss named after the model's head (``ForCausalLM`` ...). A model built from a config
    has none, and transformers then logs a warning on every call that computes a loss."""
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:
        return model
    name = type(model).__name__.replace("LMHeadModel", "ForCausalLM")
    if getattr(model, "loss_type", None) not in LOSS_MAPPING:
        for key in LOSS_MAPPING:
            if name.endswith(key):
                model.loss_type = key
                break
    return model


class HFLogits(nn.Module):
    """An HF model returning one tensor: its logits (no labels) or its loss (labels)."""

    def __init__(self, model, training):
        super().__init__()
        self.model, self.training_step = model, training

    def forward(self, *inputs):
        if self.training_step:
            *args, labels = inputs
            return self.model(*args, labels=labels).loss
        return self.model(*inputs).logits


_TEXT_SIZES = {  # size -> (batch, seq, scale: dict of config overrides)
    "full": (8, 512, None),
    "small": (2, 64, dict(layers=2, hidden=128, heads=4, vocab=1000)),
    "quick": (2, 16, dict(layers=1, hidden=32, heads=2, vocab=128)),
}


def _text_inputs(batch, seq, vocab, training, decoder=False):
    def make(device, dtype):
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        if decoder:  # T5: encoder ids, decoder ids
            dec = torch.randint(0, vocab, (batch, seq), device=device)
            return (ids, dec, dec.clone()) if training else (ids, dec)
        return (ids, ids.clone()) if training else (ids,)
    return make


def _hf(cls_name, cfg_name, full: dict, small_map: Callable, training_decoder=False):
    def build(size, training):
        import transformers
        batch, seq, scale = _TEXT_SIZES[size]
        kw = dict(full)
        if scale is not None:
            kw.update(small_map(scale, seq))
        cfg = _zero_dropout_config(getattr(transformers, cfg_name)(**kw))
        model = _with_loss_type(getattr(transformers, cls_name)(cfg))
        vocab = cfg.vocab_size
        if training_decoder:
            class T5Step(nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.model = m

                def forward(self, ids, dec, labels=None):
                    if labels is not None:
                        return self.model(input_ids=ids, decoder_input_ids=dec, labels=labels).loss
                    return self.model(input_ids=ids, decoder_input_ids=dec).logits
            return T5Step(model), _text_inputs(batch, seq, vocab, training, decoder=True)
        return HFLogits(model, training), _text_inputs(batch, seq, vocab, training)
    return build


_register("gpt2", "hf", "GPT-2 small (124M), LM head, 8 x 512")(_hf(
    "GPT2LMHeadModel", "GPT2Config", {},
    lambda s, seq: dict(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"], vocab_size=s["vocab"],
                        n_positions=max(seq, 64))))
_register("bert", "hf", "BERT-base, masked LM head, 8 x 512")(_hf(
    "BertForMaskedLM", "BertConfig", {},
    lambda s, seq: dict(num_hidden_layers=s["layers"], hidden_size=s["hidden"], num_attention_heads=s["heads"],
                        intermediate_size=4 * s["hidden"], vocab_size=s["vocab"], max_position_embeddings=max(seq, 64))))
_register("t5", "hf", "T5-small, encoder-decoder, 8 x 512 each")(_hf(
    "T5ForConditionalGeneration", "T5Config", {},
    lambda s, seq: dict(num_layers=s["layers"], num_decoder_layers=s["layers"], d_model=s["hidden"],
                        d_kv=s["hidden"] // s["heads"], num_heads=s["heads"], d_ff=4 * s["hidden"],
                        vocab_size=s["vocab"]), training_decoder=True))
_register("llama", "hf", "Llama-style decoder: 8 layers x 1024, GQA 16/4 heads, vocab 32000, 8 x 512")(_hf(
    "LlamaForCausalLM", "LlamaConfig",
    dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024),
    lambda s, seq: dict(hidden_size=s["hidden"], intermediate_size=3 * s["hidden"], num_hidden_layers=s["layers"],
                        num_attention_heads=s["heads"], num_key_value_heads=max(1, s["heads"] // 2),
                        vocab_size=s["vocab"], max_position_embeddings=max(seq, 64))))


def _hf_vit(size, training):
    import transformers
    batch, image = {"full": (32, 224), "small": (2, 32), "quick": (2, 16)}[size]
    kw = {} if size == "full" else dict(image_size=image, patch_size=8, hidden_size=64 if size == "small" else 32,
                                        num_hidden_layers=2 if size == "small" else 1, num_attention_heads=4 if size == "small" else 2,
                                        intermediate_size=128 if size == "small" else 64)
    cfg = _zero_dropout_config(transformers.ViTConfig(num_labels=1000 if size == "full" else 10, **kw))
    model = HFLogits(_with_loss_type(transformers.ViTForImageClassification(cfg)), training)
    return model, _image_inputs(batch, image, cfg.num_labels, training)


_register("hf_vit", "hf", "HF ViT-B/16, batch 32 at 224x224")(_hf_vit)


# ----------------------------------------------------------------------------- vision
class Classifier(nn.Module):
    """An image classifier returning logits, or the cross-entropy loss given labels."""

    def __init__(self, model, training):
        super().__init__()
        self.model, self.training_step = model, training

    def forward(self, x, labels=None):
        logits = self.model(x)
        if self.training_step:
            return F.cross_entropy(logits.float(), labels)
        return logits


def _image_inputs(batch, image, classes, training):
    def make(device, dtype):
        x = torch.randn(batch, 3, image, image, device=device, dtype=dtype)
        if training:
            return x, torch.randint(0, classes, (batch,), device=device)
        return (x,)
    return make


_VISION_SIZES = {"full": (32, 224), "small": (2, 64), "quick": (2, 32)}


def _torchvision(arch):
    def build(size, training):
        import torchvision
        batch, image = _VISION_SIZES[size]
        if arch in ("vit_b_16", "swin_t") and size != "full":
            image = 224 if arch == "vit_b_16" else 64  # ViT's position table fixes 224
        model = torchvision.models.get_model(arch, weights=None)
        return Classifier(model, training), _image_inputs(batch, image, 1000, training)
    return build


for _arch, _note in (("resnet50", "ResNet-50"), ("mobilenet_v3_large", "MobileNetV3-L"),
                     ("efficientnet_b0", "EfficientNet-B0"), ("convnext_tiny", "ConvNeXt-T"),
                     ("vit_b_16", "ViT-B/16"), ("swin_t", "Swin-T"), ("densenet121", "DenseNet-121")):
    _register(f"tv_{_arch}", "torchvision", f"torchvision {_note}, weights=None, batch 32 at 224x224")(_torchvision(_arch))


def _timm(arch):
    def build(size, training):
        import timm
        batch, image = _VISION_SIZES[size]
        if any(k in arch for k in ("deit", "mixer")):
            image = 224  # fixed patch grids
        model = timm.create_model(arch, pretrained=False)
        return Classifier(model, training), _image_inputs(batch, image, 1000, training)
    return build


for _arch in ("resnet50", "regnety_016", "deit_small_patch16_224", "mixer_b16_224", "efficientnet_b0"):
    _register(f"timm_{_arch}", "timm", f"timm {_arch}, pretrained=False, batch 32 at 224x224")(_timm(_arch))


def available(group: str) -> bool:
    mod = {"hf": "transformers", "torchvision": "torchvision", "timm": "timm"}[group]
    try:
        __import__(mod)
        return True
    except Exception:  # noqa: BLE001 - absent or broken: either way not usable
        return False


def resolve(spec: str) -> list[str]:
    """A comma list of model and group names ("all": every model) -> model names, in order."""
    names: list[str] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "all":
            picked = list(MODELS)
        elif part in GROUPS:
            picked = GROUPS[part]
        elif part in MODELS:
            picked = [part]
        else:
            raise KeyError(f"unknown model or group {part!r}; known groups: {', '.join(GROUPS)}; "
                           f"models: {', '.join(MODELS)}")
        names += [n for n in picked if n not in names]
    return names
