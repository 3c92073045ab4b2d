"""Tiny configs and inputs for ``benchmarks.family_sweep``: one table of families by kind
(decoder, encoder, encoder-decoder, audio encoder-decoder, vision), each a ``(model, kwargs)``
built from ``AutoConfig.for_model`` with random weights; no downloads.

Shared keyword sets go to every family of a kind (a config keeps a name it does not use as a
plain attribute, and ``attribute_map`` translates GPT-2's ``n_embd`` and the like); ``OVERRIDES``
holds what one family needs beyond them (head sizes its rotary embedding can fit, stage lists
of the convolutional nets)."""
from __future__ import annotations

import torch

DECODERS = ("llama,mistral,qwen2,qwen3,gemma2,gemma3_text,opt,falcon,bloom,mpt,gpt_neox,starcoder2,"
            "olmo2,cohere,stablelm,mixtral,qwen2_moe,qwen3_moe,olmoe,granitemoe,phimoe,xglm,ctrl,"
            "exaone4,persimmon,biogpt,mamba,falcon_mamba,gpt2,gptj,codegen,gpt_bigcode,phi,phi3")
ENCODERS = ("bert,roberta,deberta-v2,deberta,xlm-roberta,mpnet,big_bird,camembert,ernie,roformer,"
            "canine,mobilebert,layoutlm,markuplm,rembert,nystromformer,yoso,fnet,ibert,luke,longformer,mra")
SEQ2SEQ = ("t5,mt5,umt5,longt5,bart,mbart,pegasus,marian,m2m_100,blenderbot,blenderbot-small,led,"
           "plbart,prophetnet,bigbird_pegasus,switch_transformers")
AUDIO = "whisper,speech_to_text"
VISION = ("vit,deit,beit,swin,swinv2,convnext,convnextv2,resnet,regnet,mobilenet_v2,mobilevit,"
          "efficientnet,levit,poolformer,segformer,dinov2,clip_vision_model,siglip_vision_model,"
          "bit,focalnet,pvt_v2,data2vec-vision,mobilenet_v1")
KINDS = {"decoder": DECODERS, "encoder": ENCODERS, "seq2seq": SEQ2SEQ, "audio": AUDIO, "vision": VISION}
ALL = ",".join(KINDS.values())

VOCAB = 128
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, num_local_experts=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, state_size=8)
# the names BART-like, T5-like and ProphetNet configs give the same sizes
SEQ2SEQ_SIZES = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, max_position_embeddings=64, num_layers=2, num_decoder_layers=2,
                     num_heads=4, d_ff=64, d_kv=8, hidden_size=32, num_encoder_layers=2,
                     num_encoder_attention_heads=2, num_decoder_attention_heads=2,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     decoder_start_token_id=0, num_experts=4, expert_capacity=8)
VIT_SIZES = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=2, intermediate_size=64)
IMAGE = 32
OVERRIDES = {
    "gptj": dict(rotary_dim=4), "phi3": dict(pad_token_id=0), "codegen": dict(rotary_dim=4),
    "led": dict(attention_window=4, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64),
    "bigbird_pegasus": dict(attention_type="original_full"),
    "longt5": dict(local_radius=4),
    "prophetnet": dict(ngram=2, num_buckets=8, relative_max_distance=16),
    "whisper": dict(num_mel_bins=16, max_source_positions=16, max_target_positions=32),
    "speech_to_text": dict(num_mel_bins=16, input_feat_per_channel=16, max_source_positions=64,
                           max_target_positions=32, conv_channels=32, num_conv_layers=2),
    "swin": dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
    "swinv2": dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
    "focalnet": dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32]),
    "convnext": dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1]),
    "convnextv2": dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1]),
    "resnet": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    "bit": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck",
                num_groups=4),
    "regnet": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8),
    "mobilenet_v2": dict(image_size=IMAGE, depth_multiplier=0.25),
    "mobilenet_v1": dict(image_size=IMAGE, depth_multiplier=0.25),
    "mobilevit": dict(image_size=64, patch_size=2, hidden_sizes=[16, 16, 24], neck_hidden_sizes=[8, 8, 16, 16, 16, 24, 32],
                      num_attention_heads=2),
    "efficientnet": dict(image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320),
    "levit": dict(image_size=64, patch_size=16, hidden_sizes=[16, 24, 32], num_attention_heads=[2, 2, 2],
                  depths=[1, 1, 1], key_dim=[8, 8, 8]),
    "poolformer": dict(hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1]),
    "segformer": dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                      patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                      decoder_hidden_size=32),
    "pvt_v2": dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                   patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
}
# families whose code, under any compiler (``is_torchdynamo_compiling()``), skips making the
# default attention mask and then indexes it: they get an all-ones mask, as a tokenizer gives
NEEDS_MASK = {"longt5", "switch_transformers"}
# families whose config takes the ViT-style sizes (one hidden size, a patch size)
VIT_LIKE = {"vit", "deit", "beit", "dinov2", "clip_vision_model", "siglip_vision_model", "data2vec-vision"}


def kind_of(family):
    for kind, names in KINDS.items():
        if family in names.split(","):
            return kind
    return "decoder" if family not in VIT_LIKE else "vision"


def _sizes(family, kind):
    if kind in ("decoder", "encoder"):
        return dict(TEXT)
    if kind in ("seq2seq", "audio"):
        sizes = dict(SEQ2SEQ_SIZES)
        if family == "prophetnet":  # maps decoder_layers onto a num_hidden_layers it refuses to set
            del sizes["decoder_layers"]
        return sizes
    return dict(VIT_SIZES) if family in VIT_LIKE else {}


def _zero_dropout(cfg):
    """Every dropout-like probability of the config (and its sub-configs) set to 0: train mode
    stays on, its draws become identities, so kiln's loss and gradients can equal eager's."""
    for name, value in list(vars(cfg).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _zero_dropout(value)
        elif ("drop" in name or name.endswith("_prob")) and not isinstance(value, bool):
            if isinstance(value, float):
                setattr(cfg, name, 0.0)
            elif isinstance(value, list) and all(isinstance(v, float) for v in value):
                setattr(cfg, name, [0.0] * len(value))
    return cfg


def build(family, dropout=True):
    """(model, kwargs) of ``family`` from its tiny config, seeded; ``dropout=False`` zeroes every
    dropout probability in the config (the model is then deterministic in train mode too)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    kind = kind_of(family)
    cfg = AutoConfig.for_model(family, **dict(_sizes(family, kind), **OVERRIDES.get(family, {})))
    if not dropout:
        _zero_dropout(cfg)
    torch.manual_seed(0)
    if kind == "decoder":
        try:
            model = AutoModelForCausalLM.from_config(cfg)
        except ValueError:  # no causal-LM head
            model = AutoModel.from_config(cfg)
    else:
        model = AutoModel.from_config(cfg)
    return model, inputs_of(kind, cfg)


def inputs_of(kind, cfg):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    if kind in ("decoder", "encoder"):
        return dict(input_ids=ids)
    decoder_ids = torch.randint(3, VOCAB, (2, 6), generator=g)
    if kind == "seq2seq":
        if cfg.model_type in NEEDS_MASK:
            return dict(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=decoder_ids)
        return dict(input_ids=ids, decoder_input_ids=decoder_ids)
    if kind == "audio":
        if cfg.model_type == "whisper":  # its encoder wants exactly 2 * max_source_positions frames
            feats = torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g)
        else:  # speech_to_text: (batch, frames, features)
            feats = torch.randn(2, 32, cfg.input_feat_per_channel, generator=g)
        return dict(input_features=feats, decoder_input_ids=decoder_ids)
    size = getattr(cfg, "image_size", IMAGE)
    size = size if isinstance(size, int) and size <= 64 else IMAGE
    return dict(pixel_values=torch.randn(2, getattr(cfg, "num_channels", 3), size, size, generator=g))
