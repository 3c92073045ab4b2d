"""GPU time per training step, kernel by kernel: eager, torch.compile and kiln side by side
(torch.profiler over 3 steps after 4 warm-up steps), for the 4-layer GPT of
benchmarks/train_gpt.py's "medium" config (bf16, batch 8, seq 512, vocab 8192).

    python -m benchmarks.profile_train_step [medium|gpt2]   # CUDA only; KILN_PROF_TOP=40
    python -m benchmarks.profile_train_step gpt2 --kiln-kernels   # kiln's kernels per graph, with GB/s
    python -m benchmarks.profile_train_step gpt2 --kiln-only      # kiln alone (an A/B of settings)

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
_names = [a for a in sys.argv[1:] if not a.startswith("--")]
cfg, batch = CONFIGS[_names[0] if _names else "medium"]
TOP = int(os.environ.get("KILN_PROF_TOP", "22"))
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke test of the script only
base = GPT(cfg).to(DEV).to(torch.bfloat16)
data = counting_batches(8, batch, cfg, device=DEV)

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

def kiln_kernels(model):
    """kiln's kernels per graph with kiln's own profiler (``kiln.observe.profile``: device times
    matched to each graph's launches, so a forward and a backward kernel of the same name stay
    apart), with the bytes of each kernel's tensor arguments and the bandwidth that implies."""
    import json
    from kiln.observe import profile as kprof
    compiled = kiln.compile(model)
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-4, fused=True)
    def step(x, y):
        loss = compiled(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    x, y = data[0]
    run = kprof.profile(step, x, y, runs=3)
    rows = json.load(open(os.path.join(run, "profile.json")))["kernels"]
    origins = {}
    for folder in os.listdir(run):
        mpath = os.path.join(run, folder, "metrics.json")
        if os.path.exists(mpath):
            for k in json.load(open(mpath))["kernels"]:
                origins[(folder, k["name"])] = k["origins"]
    rows.sort(key=lambda r: -r["total_us"])
    total = sum(r["total_us"] for r in rows) / 3
    print(f"== kiln kernels by graph (kiln.observe.profile, 3 steps): {total/1e3:.2f} ms per step in kiln's kernels")
    print(f"  {'folder':24s} {'kernel':16s} {'calls':>5s} {'med us':>8s} {'MB':>8s} {'GB/s':>7s}  origins")
    for r in rows[:TOP]:
        mb = r.get("bytes", 0) / 1e6
        gbs = r.get("gb_per_s") or 0
        org = " | ".join(o.split(" = ", 1)[0] + "=" + o.split(" = ", 1)[-1].split("(", 1)[0]
                         for o in origins.get((r["folder"], r["kernel"]), [])[:6])
        print(f"  {r['folder'][:24]:24s} {r['kernel']:16s} {r['calls']//3:5d} {r['median_us']:8.1f} "
              f"{mb:8.1f} {gbs:7.0f}  {org[:150]}")
    print("  debug dump (kernel sources):", run)


if "--kiln-kernels" in sys.argv:
    kiln_kernels(copy.deepcopy(base))
    sys.exit(0)

rec = []
api._RECORDERS.append(rec)
t = time.time()
listed = top("kiln", kiln.compile(copy.deepcopy(base)))
origins(listed, rec)
times = collections.Counter()
for c in rec:
    for k, v in c.stage_times.items(): times[k] += v
print("kiln compile stage times (s):", {k: round(v, 2) for k, v in times.items()}, "contexts", len(rec))
if "--kiln-only" not in sys.argv:  # --kiln-only: an A/B of kiln settings without the others
    top("torch.compile", torch.compile(copy.deepcopy(base)))
    top("eager", copy.deepcopy(base))
