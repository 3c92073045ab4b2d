"""kiln.compile on DistributedDataParallel (kiln/distributed.py).

Two gloo ranks on the CPU (tests/workloads/ddp_worker.py) train eager DDP and kiln-compiled DDP
for 3 steps from the same weights: the gradients match after every step. With a small bucket
cap the compiled forward is split into several graphs, still matching, and buckets are reduced
before the first graph's backward has run (the all-reduce overlaps the backward). In-process
tests check the split itself on captured graphs."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.capture import trace
from kiln.distributed import SplitGraph, bucket_assignment, compile_split, split_at_buckets
from testing import assert_close

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ddp_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")


# ---------------------------------------------------------------------------- two gloo ranks
@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    world = 2
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_worker.py"), str(r), str(world),
                               str(tmp / "init"), str(tmp / f"rank{r}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the DDP workers did not finish in 300 s")
        logs.append(out)
    for r, (p, out) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out}"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("name", ["one_graph", "split"])
def test_compiled_ddp_gradients_equal_eager_ddp(ranks, name):
    for res in ranks:
        r = res[name]
        print(f"rank {res['rank']} {name}: {r['graphs']} graphs, gradient differences "
              f"{r['grad_diff_per_step']}, parameter difference {r['param_diff']:.2e}")
        assert len(r["grad_diff_per_step"]) == ddp_worker.STEPS
        tol = 1e-5 + 1e-4 * r["grad_scale"]
        assert max(r["grad_diff_per_step"]) <= tol, r
        assert r["param_diff"] <= tol
        assert r["stats"]["fallbacks"] == 0 and r["stats"]["graph_breaks"] == 0
        assert r["stats"]["kernels_generated"] > 0  # kiln's kernels ran, not eager
        assert r["inner_forward_restored"]  # the DDP module is left as it was
    assert all(res["ranks_agree"] for res in ranks)


def test_default_bucket_cap_keeps_one_graph(ranks):
    r = ranks[0]["one_graph"]
    assert r["graphs"] == 1 and r["stats"]["ddp_graphs"] == 0


def test_small_bucket_cap_splits_and_overlaps(ranks):
    for res in ranks:
        r = res["split"]
        assert r["graphs"] > 1, r
        assert r["stats"]["ddp_graphs"] >= r["graphs"]
        # the last step (buckets rebuilt by DDP after step 0): bucket 0, holding the last
        # layers' gradients, is reduced before the first graph's backward has even started
        last = r["events"][r["events"].index(f"step {ddp_worker.STEPS - 1}"):]
        assert "first piece backward" in last, last
        buckets_before = [e for e in last[:last.index("first piece backward")] if e.startswith("bucket")]
        assert "bucket 0" in buckets_before and len(buckets_before) >= 2, last


# ---------------------------------------------------------------------------- the split, in process
def _captured(model, *args):
    return trace(model.forward, args, {}).graph


def test_bucket_assignment_is_monotone_and_fills_buckets():
    torch.manual_seed(0)
    model = ddp_worker.Net()
    graph = _captured(model, torch.randn(4, 16))
    cap = ddp_worker.SMALL_CAP_BYTES
    assign, param_bytes = bucket_assignment(graph, cap)
    order = [assign[n] for n in graph.nodes if n in assign]
    assert order == sorted(order)  # inputs always come from the same or an earlier piece
    assert sum(param_bytes) == sum(p.numel() * 4 for p in model.parameters())
    assert len(param_bytes) == 4
    # every piece after the first holds at least the cap (it is filled from the end)
    assert all(b >= cap for b in param_bytes[1:])
    _, one = bucket_assignment(graph, 10**9)
    assert len(one) == 1
    assert split_at_buckets(graph, 10**9) is None


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_split_graph_trains_like_eager(backend):
    torch.manual_seed(0)
    model = ddp_worker.Net()
    x = torch.randn(16, 8).t()  # a non-contiguous input
    capture = trace(model.forward, (x,), {})
    with kiln.config.patch(strict=True):
        split = compile_split(capture.graph, backend, ddp_worker.SMALL_CAP_BYTES)
    assert isinstance(split, SplitGraph) and split.graph_count == 4
    y = torch.randn(8, 8)
    (out,) = split(*capture.fetch({"self": model, "x": x}))
    F.mse_loss(out, y).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x)
    F.mse_loss(want, y).backward()
    assert_close(out, want)
    for g, p in zip(got, model.parameters()):
        assert_close(g, p.grad)


def test_split_gpt_with_tied_weights_trains_like_eager():
    """Views, sdpa, a split into q/k/v (tuple elements) and a weight used by the first piece
    and the last (tied embedding and LM head)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from gpt import GPT, GPTConfig, counting_batches
    cfg = GPTConfig(vocab=64, seq=16, layers=2, heads=4, dim=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    x, y = counting_batches(1, 3, cfg)[0]
    capture = trace(model.forward, (x, y), {})
    with kiln.config.patch(strict=True):
        split = compile_split(capture.graph, "aot_eager", 20000)
    assert isinstance(split, SplitGraph) and split.graph_count >= 4
    (loss,) = split(*capture.fetch({"self": model, "idx": x, "targets": y}))
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x, y)
    want.backward()
    assert_close(loss, want)
    for (name, p), g in zip(model.named_parameters(), got):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_split_graph_without_grad_is_one_graph():
    torch.manual_seed(0)
    model = ddp_worker.Net()
    x = torch.randn(4, 16)
    capture = trace(model.forward, (x,), {})
    with torch.no_grad():
        compiled = compile_split(capture.graph, "aot_eager", ddp_worker.SMALL_CAP_BYTES)
        assert not isinstance(compiled, SplitGraph)  # nothing to overlap without a backward
        assert_close(compiled(*capture.fetch({"self": model, "x": x}))[0], model(x))


def test_symbolic_graph_stays_whole():
    torch.manual_seed(0)
    model = ddp_worker.Net()
    x = torch.randn(6, 16)
    graph = trace(model.forward, (x,), {}, dynamic=True).graph
    assert split_at_buckets(graph, ddp_worker.SMALL_CAP_BYTES) is None
