"""A cold compile's timeline: when each stage logs, when each build request goes to a worker and
comes back (with the worker's own compile and C-launcher times, and the kernel source's size),
and when the first result arrives. GPT-2 small's training step (or inference) on CUDA, with
empty caches in a fresh directory; it needs a GPU (the builds it times are Triton's).

    python -m benchmarks.compile_timeline [--phase train|inference] [--save-slowest DIR]

Session 22 found with it: 0.8 s between codegen and the first build request (the parent built
Triton's driver module with gcc), C launchers taking a third of each build, and the backward's
longest kernel bounding the training step's build stage.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", default="train", choices=["train", "inference"])
    p.add_argument("--logs", default="perf,aot", help="KILN_LOGS channels to stamp (default perf,aot)")
    p.add_argument("--save-slowest", metavar="DIR", help="copy the four slowest kernels' sources here")
    a = p.parse_args(argv)

    cache = tempfile.mkdtemp(prefix="kiln-timeline-")  # cold: nothing cached
    os.environ["KILN_CACHE_DIR"] = os.path.join(cache, "kiln")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    os.environ["KILN_LOGS"] = a.logs
    import torch
    if not torch.cuda.is_available():
        print("compile_timeline: needs a CUDA device (it times Triton builds)", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    sys.path.insert(0, ROOT)
    from gpt import GPT, GPT2_SMALL
    torch.manual_seed(0)
    model = GPT(GPT2_SMALL).to("cuda")
    idx = torch.randint(0, GPT2_SMALL.vocab, (8, 1024), device="cuda")
    targets = torch.randint(0, GPT2_SMALL.vocab, (8, 1024), device="cuda")
    torch.cuda.synchronize()

    import kiln
    from kiln import log as klog
    from kiln.runtime import pool
    events, lock = [], threading.Lock()
    real_request = pool.Worker.request
    t0 = [time.perf_counter()]

    def request(self, msg):  # every worker round trip, stamped
        start = time.perf_counter()
        reply = real_request(self, msg)
        with lock:
            events.append((msg, reply, start, time.perf_counter()))
        return reply
    pool.Worker.request = request

    class Stamped(klog._Formatter):
        def format(self, record):
            return f"{time.perf_counter() - t0[0]:7.3f} " + super().format(record)
    klog.configure()
    for h in logging.getLogger("kiln").handlers:
        h.setFormatter(Stamped())

    compiled = kiln.compile(model)
    t0[0] = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if a.phase == "inference":
            with torch.no_grad():
                compiled(idx, targets)
        else:
            loss = compiled(idx, targets)
            forward_s = time.perf_counter() - t0[0]
            loss.backward()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0[0]
    from kiln.counters import stage_totals
    out = sys.stderr
    if a.phase == "train":
        print(f"forward returned at {forward_s:.3f} s", file=out)
    print(f"first result at {first:.3f} s; stages {dict((k, round(v, 3)) for k, v in stage_totals().items())}",
          file=out)
    print(f"{'request':8s} {'kernel':16s} {'source':>22s} {'sent':>8s} {'back':>8s} {'worker':>7s} {'launcher':>8s}",
          file=out)
    for msg, reply, start, end in sorted(events, key=lambda e: e[2]):
        size = ""
        if msg.get("path") and os.path.exists(msg["path"]):
            src = open(msg["path"]).read()
            size = f"{src.count(chr(10))}L {src.count('tl.load')}ld {src.count('tl.store')}st"
        print(f"{msg.get('kind', ''):8s} {msg.get('name', ''):16s} {size:>22s} {start - t0[0]:8.3f} "
              f"{end - t0[0]:8.3f} {reply.get('seconds', 0):7.3f} {reply.get('launcher_seconds', 0):8.3f}", file=out)
    if a.save_slowest:
        os.makedirs(a.save_slowest, exist_ok=True)
        builds = [e for e in events if e[0].get("path")]
        for msg, reply, _, _ in sorted(builds, key=lambda e: -e[1].get("seconds", 0))[:4]:
            shutil.copy(msg["path"], os.path.join(a.save_slowest, f"{msg['name']}_{os.path.basename(msg['path'])}"))
    shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
