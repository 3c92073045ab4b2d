"""A/B in one process: the GPT-2 small training step (bf16, batch 8 x 1024) with kiln's fused
attention training (``config.fused_attention_backward``: the forward keeps the log-sum-exp, the
backward calls the library's backward) against the recomputing backward, and eager. Runs are
interleaved, 5 rounds of 6 steps each; medians and minimums of the wall time per step.

    python -m benchmarks.attention_ab      # CUDA only
"""
import os, sys, copy, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import kiln
from gpt import GPT, counting_batches
from benchmarks.train_gpt import CONFIGS
torch.manual_seed(0)
cfg, batch = CONFIGS["gpt2"]
base = GPT(cfg).cuda().to(torch.bfloat16)
data = counting_batches(6, batch, cfg, device="cuda")
runs = {}
for name, fused in (("fused", True), ("recompute", False), ("eager", None)):
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if fused is not None:
        with kiln.config.patch(fused_attention_backward=fused):
            m = kiln.compile(model)
            x, y = data[0]
            t0 = time.perf_counter(); m(x, y).backward(); torch.cuda.synchronize()
            print(name, "first step", round(time.perf_counter() - t0, 2), "s", flush=True)
    else:
        m = model
    def step(x, y, m=m, opt=opt):
        loss = m(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    runs[name] = step
for name, step in runs.items():
    for x, y in data[:3]:
        step(x, y)
torch.cuda.synchronize()
res = {k: [] for k in runs}
for rep in range(5):
    for name, step in runs.items():
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter(); s.record()
        for x, y in data:
            step(x, y)
        e.record(); torch.cuda.synchronize()
        res[name].append(((time.perf_counter() - t0) / len(data) * 1e3, s.elapsed_time(e) / len(data)))
for name, r in res.items():
    r.sort()
    print(f"{name:10s} step median {r[2][0]:.2f} ms (min {r[0][0]:.2f})")
# host time of one step without GPU waiting: launch-bound check
for name, step in runs.items():
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, y = data[0]
    step(x, y)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"{name:10s} host time of one step (until the Python returns) {host*1e3:.2f} ms")
