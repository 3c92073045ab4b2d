"""GPU time per training step, kernel by kernel: eager, torch.compile and kiln side by side
(torch.profiler over 3 steps after 4 warm-up steps), for the 4-layer GPT of
benchmarks/train_gpt.py's "medium" config (bf16, batch 8, seq 512, vocab 8192).

    python -m benchmarks.profile_train_step [medium|gpt2]   # CUDA only; KILN_PROF_TOP=40

Prints each compiler's GPU time per step and its KILN_PROF_TOP (22) most expensive kernels, and kiln's compile
time by stage. Session 12 used it to find kiln's slow backward kernels (column reductions and
the decomposed attention backward).
"""
import os, sys, copy, time, torch, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import kiln
from kiln import api
from gpt import GPT, GPTConfig, counting_batches
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
from benchmarks.train_gpt import CONFIGS
cfg, batch = CONFIGS[sys.argv[1] if len(sys.argv) > 1 else "medium"]
TOP = int(os.environ.get("KILN_PROF_TOP", "22"))
base = GPT(cfg).cuda().to(torch.bfloat16)
data = counting_batches(8, batch, cfg, device="cuda")

def top(name, model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    def step(x, y):
        loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    for x, y in data[:4]: step(x, y)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for x, y in data[4:7]: step(x, y)
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name][0] += 1; agg[e.name][1] += e.device_time
    tot = sum(v[1] for v in agg.values()) / 3
    print(f"== {name}: GPU time per step {tot/1e3:.2f} ms, kernels/step {sum(v[0] for v in agg.values())/3:.0f}")
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][1])[:TOP]
    for k, (n, t) in ranked:
        print(f"  {t/3/1e3:7.3f} ms  x{n//3:3d}  {k[:110]}")
    return [k for k, _ in ranked]


def origins(names, contexts):
    """What each of kiln's listed kernels computes: its graph and its first origin lines (a
    name can occur in the forward and the backward graph, and kernels sharing a binary run
    under their representative's name)."""
    print("== kiln kernels in the list: graph, kernel kind, origins")
    for name in names:
        if not name.startswith("kiln_"):
            continue
        for c in contexts:
            for k in c.kernels:
                if k.name == name:
                    src = k.source.splitlines()
                    kind = "reduction" if any("tl.sum(" in l or "tl.max(" in l or "acc" in l for l in src) else "pointwise"
                    froms = [l.split("from: ", 1)[1][:100] for l in src if "from: " in l][:3]
                    print(f"  {name:16s} {c.name[:28]:28s} {kind:9s} {' | '.join(froms)}")

rec = []
api._RECORDERS.append(rec)
t = time.time()
listed = top("kiln", kiln.compile(copy.deepcopy(base)))
origins(listed, rec)
times = collections.Counter()
for c in rec:
    for k, v in c.stage_times.items(): times[k] += v
print("kiln compile stage times (s):", {k: round(v, 2) for k, v in times.items()}, "contexts", len(rec))
top("torch.compile", torch.compile(copy.deepcopy(base)))
top("eager", copy.deepcopy(base))
