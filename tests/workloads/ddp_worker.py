"""One rank of the DDP test (tests/workloads/test_ddp.py starts two of these with gloo).

    python ddp_worker.py RANK WORLD_SIZE INIT_FILE OUT_JSON

From the same initial weights, three DistributedDataParallel copies of a small network train 3
SGD steps on this rank's batches: eager DDP, kiln-compiled DDP with DDP's default bucket cap
(one graph), and kiln-compiled DDP with a small bucket cap (split into several graphs). The
gradients after every step and the parameters at the end are compared with eager DDP's; the
order in which buckets were reduced and pieces ran their backward is recorded. Everything goes
into OUT_JSON for the test to assert on.
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
WIDTH = 512
# One hidden Linear (1 MiB + 2 KiB) fills a bucket. Wide enough that DDP's own first bucket
# (1 MiB in torch versions that always use a small first bucket) holds only the last layers.
SMALL_CAP_MB = 1.0
SMALL_CAP_BYTES = int(SMALL_CAP_MB * 2**20)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.hidden = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(3)])
        self.out = nn.Linear(WIDTH, 8)

    def forward(self, x):
        h = self.norm(F.gelu(self.inp(x)))
        for layer in self.hidden:
            h = h + torch.tanh(layer(h))
        return self.out(h)


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for step in range(STEPS):
        x = torch.randn(16, 12, generator=g).t() if step == 1 else torch.randn(12, 16, generator=g)
        out.append((x, torch.randn(12, 8, generator=g)))  # step 1: a transposed (non-contiguous) input
    return out


def train(model, data, events=None, before_step=None):
    """SGD steps; the all-reduced gradients after each backward, then the final parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step, (x, y) in enumerate(data):
        if before_step is not None:
            before_step(step)
        if events is not None:
            events.append(f"step {step}")
        loss = F.mse_loss(model(x), y)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads, [p.detach().clone() for p in model.parameters()]


def recording_allreduce(events):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        if events is not None:
            events.append(f"bucket {bucket.index()}")
        return allreduce_hook(None, bucket)
    return hook


def largest_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def main(rank, world, init_file, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import kiln

    torch.manual_seed(0)
    base = Net()
    data = batches(rank)
    result = {"rank": rank}

    eager = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    eager.register_comm_hook(None, recording_allreduce(None))
    want_grads, want_params = train(eager, data)

    for name, cap_mb in (("one_graph", None), ("split", SMALL_CAP_MB)):
        kiln.reset()
        ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=cap_mb)
        events = []
        ddp.register_comm_hook(None, recording_allreduce(events))
        pieces = []

        def watch_first_piece(step):
            """After the first step compiled it: note when the first piece's backward runs."""
            if step != 1:
                return
            compiled_graph = compiled._compiled_forward.cache.entries[0].compiled
            pieces.extend(getattr(compiled_graph, "pieces", ()))
            if pieces:
                first = pieces[0].compiled
                backward_fn = first.backward_fn

                def watched(*a, **k):
                    events.append("first piece backward")
                    return backward_fn(*a, **k)
                first.backward_fn = watched

        with kiln.config.patch(strict=True):
            compiled = kiln.compile(ddp)
            got_grads, got_params = train(compiled, data, events, watch_first_piece)
        stats = kiln.stats()
        result[name] = {
            "graphs": max(1, len(pieces)),
            "piece_param_bytes": [p.param_bytes for p in pieces],
            "grad_diff_per_step": [largest_diff(g, w) for g, w in zip(got_grads, want_grads)],
            "grad_scale": max(float(g.abs().max()) for g in want_grads[-1]),
            "param_diff": largest_diff(got_params, want_params),
            "events": events,
            "stats": {k: stats.get(k, 0) for k in ("graphs_compiled", "graph_breaks", "fallbacks",
                                                   "kernels_generated", "ddp_graphs")},
            "inner_forward_restored": "forward" not in ddp.module.__dict__,
        }
    # the all-reduced gradients are the same on every rank
    flat = torch.cat([g.flatten() for g in want_grads[-1]])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    result["ranks_agree"] = all(torch.equal(gathered[0], t) for t in gathered)
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
