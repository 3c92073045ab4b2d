"""One rank of the FSDP2 test (tests/distributed/test_fsdp2.py starts two of these with gloo).

    python fsdp2_worker.py RANK WORLD_SIZE INIT_FILE OUT_JSON

From the same initial weights, a small transformer-like network trains 3 AdamW steps on this
rank's batches under ``torch.distributed.fsdp.fully_shard``, eagerly (the reference) and with
kiln in each of these arrangements:

* ``layer_before``: each block ``kiln.compile``-d, then ``fully_shard`` on each compiled block
  and on the root (torchtitan's order for torch.compile);
* ``layer_after``: ``fully_shard`` on each block and the root, then each sharded block wrapped
  by ``kiln.compile``;
* ``root``: ``fully_shard`` on the root alone, the root compiled;
* ``root_of_layers``: ``fully_shard`` per block and on the root, the root compiled (each sharded
  block is a graph break whose forward kiln compiles on its own);
* ``root_wrapper``: the root compiled, then the compiled module sharded;
* ``root_of_compiled_layers``: as ``layer_before``, and the root compiled too;
* ``bf16``: as ``layer_before`` under a bf16 ``MixedPrecisionPolicy``.

The sharded gradients after every step and the full parameters at the end are compared with
eager FSDP2's; kiln's counters are recorded. Everything goes into OUT_JSON.
"""
import copy
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STEPS = 3
WIDTH = 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(STEPS)]


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(model, params, data, loss_of=None, opt=None):
    """AdamW steps; this rank's gradient shards after each backward, then the full parameters."""
    opt = opt(params) if opt is not None else torch.optim.AdamW(params, lr=0.01)
    grads = []
    for x, y in data:
        loss = loss_of(model, x, y) if loss_of is not None else F.mse_loss(model(x), y)
        loss.backward()
        grads.append([local(p.grad).clone() for p in params])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads, [full(p.detach()).clone() for p in params]


def arrange(base, how):
    """(the module to call, its parameters in ``base``'s order) for arrangement ``how``."""
    import kiln
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    net = copy.deepcopy(base)
    if how.endswith("bf16"):  # FSDP2 mixed precision: bf16 unsharded parameters and inputs
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(net.blocks):
            if how.startswith("kiln"):
                net.blocks[i] = kiln.compile(block)
            fully_shard(net.blocks[i], mp_policy=mp, reshard_after_forward=False)
        fully_shard(net, mp_policy=mp)
        return net, list(net.parameters()), net
    if how == "eager":
        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        return net, list(net.parameters()), net
    if how == "layer_before":
        for i, block in enumerate(net.blocks):
            net.blocks[i] = kiln.compile(block)
            fully_shard(net.blocks[i])
        fully_shard(net)
        return net, list(net.parameters()), net
    if how == "layer_after":
        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        for i, block in enumerate(net.blocks):
            net.blocks[i] = kiln.compile(block)
        return net, list(net.parameters()), net
    if how == "root":
        fully_shard(net)
        return kiln.compile(net), list(net.parameters()), net
    if how == "root_wrapper":  # compiled first, then the compiled module sharded
        compiled = kiln.compile(net)
        fully_shard(compiled)
        return compiled, list(compiled.parameters()), net
    if how == "root_of_layers":
        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        return kiln.compile(net), list(net.parameters()), net
    if how == "root_of_compiled_layers":  # layers compiled and sharded, and the root compiled
        for i, block in enumerate(net.blocks):
            net.blocks[i] = kiln.compile(block)
            fully_shard(net.blocks[i])
        fully_shard(net)
        return kiln.compile(net), list(net.parameters()), net
    raise ValueError(how)


def tiny_gpt2():
    """A 2-layer GPT-2 from transformers (random weights), or None without transformers."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


def gpt2_arrange(base, how):
    import kiln
    from torch.distributed.fsdp import fully_shard

    net = copy.deepcopy(base)
    blocks = net.transformer.h
    if how == "layers":  # each GPT2Block compiled, then sharded (torchtitan's order)
        for i, block in enumerate(blocks):
            blocks[i] = kiln.compile(block)
    for block in blocks:
        fully_shard(block)
    fully_shard(net)
    return (kiln.compile(net) if how == "root_of_layers" else net), list(net.parameters())


def gpt2_case(rank):
    """The tiny GPT-2, sharded per block and at the root, 3 SGD steps with ``labels=``."""
    import kiln

    base = tiny_gpt2()
    if base is None:
        return None
    g = torch.Generator().manual_seed(200 + rank)
    data = [(torch.randint(0, 64, (2, 8), generator=g), None) for _ in range(STEPS)]

    def loss_of(model, ids, _):
        return model(input_ids=ids, labels=ids).loss

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    model, params = gpt2_arrange(base, "eager")
    want_grads, want_params = train(model, params, data, loss_of, sgd)
    out = {}
    for how in GPT2_ARRANGEMENTS:
        kiln.reset()
        model, params = gpt2_arrange(base, how)
        got_grads, got_params = train(model, params, data, loss_of, sgd)
        stats = kiln.stats()
        out[how] = {
            "grad_diff_per_step": [largest_diff(a, b) for a, b in zip(got_grads, want_grads)],
            "grad_scale": max(float(t.abs().max()) for t in want_grads[-1]),
            "param_diff": largest_diff(got_params, want_params),
            "stats": {k: stats.get(k, 0) for k in ("frames_compiled", "graphs_compiled", "graph_breaks",
                                                   "fallbacks", "eager_runs", "kernels_generated")},
        }
    return out


GPT2_ARRANGEMENTS = ("layers", "root_of_layers")


def largest_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


ARRANGEMENTS = ("layer_before", "layer_after", "root", "root_wrapper", "root_of_layers",
                "root_of_compiled_layers")


def bf16_case(base, data):
    """``layer_before`` under a bf16 MixedPrecisionPolicy (and no reshard after forward),
    against eager FSDP2 under the same policy, 3 SGD steps."""
    import kiln

    def sgd(params):  # not AdamW: it turns a bf16 rounding of a tiny gradient into a full step
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    def loss_of(model, x, y):  # the bf16 output in float32: torch 2.11's mse_loss backward
        return F.mse_loss(model(x).float(), y)  # rejects a bf16 input with a float32 target

    model, params, _ = arrange(base, "eager_bf16")
    want_grads, want_params = train(model, params, data, loss_of=loss_of, opt=sgd)
    kiln.reset()
    model, params, _ = arrange(base, "kiln_bf16")
    got_grads, got_params = train(model, params, data, loss_of=loss_of, opt=sgd)
    stats = kiln.stats()
    return {"grad_diff_per_step": [largest_diff(g, w) for g, w in zip(got_grads, want_grads)],
            "grad_scale": max(float(g.abs().max()) for g in want_grads[-1]),
            "param_diff": largest_diff(got_params, want_params),
            "grad_dtype": str(got_grads[0][0].dtype),
            "stats": {k: stats.get(k, 0) for k in ("graph_breaks", "fallbacks", "eager_runs",
                                                   "kernels_generated")}}


def dtensor_inputs(rank):
    """A compiled function called with DTensors: kiln cannot trace them, so the call runs
    eagerly, with a warning, counted; the result is eager's."""
    import warnings

    import kiln
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    kiln.reset()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(1)
    a = distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(6, 3), mesh, [Replicate()])

    def f(a, b):
        return torch.relu(a @ b) + 1

    compiled = kiln.compile(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [compiled(a, b).full_tensor() for _ in range(2)]
    want = f(a, b).full_tensor()
    return {"diff": max(float((g - want).abs().max()) for g in got),
            "eager_runs": kiln.stats()["eager_runs"],
            "kiln_warnings": [str(w.message) for w in seen if "kiln" in str(w.message)]}


def main(rank, world, init_file, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import warnings

    import kiln

    torch.manual_seed(0)
    base = Net()
    data = batches(rank)
    result = {"rank": rank}
    model, params, _ = arrange(base, "eager")
    want_grads, want_params = train(model, params, data)
    result["sharded"] = all(hasattr(p, "to_local") for p in params)
    for how in ARRANGEMENTS:
        kiln.reset()
        model, params, _ = arrange(base, how)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got_grads, got_params = train(model, params, data)
        stats = kiln.stats()
        result[how] = {
            "grad_diff_per_step": [largest_diff(g, w) for g, w in zip(got_grads, want_grads)],
            "grad_scale": max(float(g.abs().max()) for g in want_grads[-1]),
            "param_diff": largest_diff(got_params, want_params),
            "stats": {k: stats.get(k, 0) for k in ("frames_compiled", "graphs_compiled", "graph_breaks",
                                                   "fallbacks", "eager_runs", "kernels_generated")},
            "kiln_warnings": [str(w.message) for w in seen if "kiln" in str(w.message)],
            # Block.forward has compiled entries of its own (not run eagerly inside a break)
            "block_forward_compiled": any(c.entries for c in kiln.api.caches_of(Block.forward.__code__)),
        }
    result["bf16"] = bf16_case(base, data)
    result["dtensor_inputs"] = dtensor_inputs(rank)
    result["gpt2"] = gpt2_case(rank)
    dist.barrier()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    try:
        main(rank, world, init_file, out)
    except Exception:  # noqa: BLE001 - the test shows this rank's traceback
        traceback.print_exc()
        sys.exit(1)
    os._exit(0)
