"""kiln's graphs and breaks over many transformers families, from tiny configs built by
``AutoConfig.for_model`` (random weights, inference under ``no_grad``), against eager's output
and, with ``--dynamo``, Dynamo's own count (``torch._dynamo.explain``, the peer's figure).

    python -m benchmarks.family_sweep                      # the default families
    python -m benchmarks.family_sweep --families bloom,mixtral --dynamo

Wider than ``benchmarks.break_table`` (the test suite's models): a family whose tiny config
the library refuses is listed as "config" and skipped. One line per family: graphs and breaks
from ``kiln.explain``, whether the output matches eager (a model that draws random numbers in
inference, ViT-MAE's masking, cannot), and the first break reasons.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

import torch

import kiln

DECODERS = ("llama,mistral,qwen2,qwen3,gemma2,gemma3_text,opt,falcon,bloom,mpt,gpt_neox,starcoder2,"
            "olmo2,cohere,stablelm,mixtral,qwen2_moe,qwen3_moe,olmoe,granitemoe,phimoe,xglm,ctrl,"
            "exaone4,persimmon,biogpt,mamba,falcon_mamba")
ENCODERS = ("bert,roberta,deberta-v2,deberta,xlm-roberta,mpnet,big_bird,camembert,ernie,roformer,"
            "canine,mobilebert,layoutlm,markuplm,rembert,nystromformer,yoso,fnet,ibert,luke,longformer,mra")
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, num_local_experts=4,
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, state_size=8)


def _build(family):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    cfg = AutoConfig.for_model(family, **SMALL)
    torch.manual_seed(0)
    try:
        return AutoModelForCausalLM.from_config(cfg).eval()
    except ValueError:  # an encoder: no causal-LM head
        return AutoModel.from_config(cfg).eval()


def _first(out):
    return out if torch.is_tensor(out) else out[0]


def sweep(family, dynamo=False):
    try:
        model = _build(family)
    except Exception as e:  # noqa: BLE001 - the library refuses the tiny config
        return f"{family:14s} config ({type(e).__name__}: {str(e)[:80]})"
    ids = torch.randint(1, SMALL["vocab_size"], (2, 12))
    kiln.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _first(model(input_ids=ids))
        out = kiln.explain(model)(input_ids=ids)
    ok = torch.allclose(_first(out.result), want, rtol=1e-3, atol=1e-3)
    line = f"{family:14s} graphs={out.graph_count:<3d} breaks={out.graph_break_count:<3d} matches_eager={ok}"
    if dynamo:
        dyn = importlib.import_module("torch._dynamo")  # the peer's figure only
        dyn.reset()
        with torch.no_grad():
            e = dyn.explain(model)(input_ids=ids)
        line += f"  dynamo={e.graph_count}/{e.graph_break_count}"
    reasons = list(dict.fromkeys(str(r)[:160] for r in out.break_reasons))[:2]
    return "\n".join([line] + [f"    {r}" for r in reasons])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.family_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=f"{DECODERS},{ENCODERS}")
    p.add_argument("--dynamo", action="store_true", help="also Dynamo's graphs/breaks")
    args = p.parse_args(argv)
    import transformers
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}", flush=True)
    for family in args.families.split(","):
        print(sweep(family, args.dynamo), flush=True)


if __name__ == "__main__":
    main()
