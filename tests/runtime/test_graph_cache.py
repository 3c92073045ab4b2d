"""The whole-graph cache: a new process compiling the same model skips codegen and builds; a
corrupt entry is logged, rebuilt and gives correct results."""
import glob
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.testing import config_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a forward (two kernels and a library call) and its lazily compiled backward, both checked
SCRIPT = textwrap.dedent("""
    import json, torch, kiln
    def f(x, w, b):
        return torch.softmax(x @ w + b, -1).sum(0) * 2
    torch.manual_seed(int(__import__("sys").argv[1]))
    x = torch.randn(6, 16).t().requires_grad_()       # non-contiguous input
    w, b = torch.randn(6, 5), torch.randn(5)          # broadcast bias
    out = kiln.compile(f)(x, w, b)
    torch.testing.assert_close(out, f(x, w, b))
    out.sum().backward()
    got = x.grad.clone(); x.grad = None
    f(x, w, b).sum().backward()
    torch.testing.assert_close(got, x.grad)
    print(json.dumps(kiln.stats()))
""")


def _run(cache_dir, seed=0, extra_env=None):
    from kiln.runtime.graph_cache import kiln_source_digest
    # the subprocesses agree on kiln's source digest even while the tree is edited around them
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(cache_dir), _KILN_TEST_SOURCE_DIGEST=kiln_source_digest(),
                          PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {})),
                     cpu_backend="cpp", graph_cache=True)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(seed)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _entries(cache_dir, kind="graphs"):
    return sorted(glob.glob(str(cache_dir / kind / "*" / "*.json")))


def test_second_process_hits_the_graph_cache_and_builds_nothing(tmp_path):
    first, _ = _run(tmp_path, seed=0)
    assert first["graph_cache_hits"] == 0 and first["kernel_builds"] >= 2
    assert first["partition_cache_hits"] == 0
    assert len(_entries(tmp_path)) == 2  # forward and backward
    assert len(_entries(tmp_path, "partitions")) == 1
    second, err = _run(tmp_path, seed=1, extra_env={"KILN_LOGS": "cache"})
    assert second["graph_cache_hits"] == 2, err
    assert second["partition_cache_hits"] == 1, err  # no min-cut: the saved set came from disk
    assert "partition of" in err
    assert second["kernel_builds"] == 0
    assert "compiled graph" in err and "from disk" in err


def test_corrupt_graph_entry_is_logged_rebuilt_and_correct(tmp_path):
    _run(tmp_path)
    entry = _entries(tmp_path)[0]
    with open(entry, "r+b") as f:
        f.truncate(40)  # a torn write
    stats, err = _run(tmp_path, seed=2, extra_env={"KILN_LOGS": "cache"})
    assert "corrupt cache entry" in err
    assert stats["graph_cache_hits"] == 1  # the other graph's entry is intact
    again, _ = _run(tmp_path, seed=3)
    assert again["graph_cache_hits"] == 2 and again["kernel_builds"] == 0


def test_entry_with_a_good_digest_but_bad_content_is_rebuilt(tmp_path):
    _run(tmp_path)
    for entry in _entries(tmp_path):
        data = json.dumps({"format": 1, "wrapper": "def call(:"}).encode()  # a key missing
        with open(entry, "wb") as f:
            f.write(data)
        with open(entry + ".sha256", "w") as f:
            f.write(hashlib.sha256(data).hexdigest())
    stats, err = _run(tmp_path, seed=4, extra_env={"KILN_LOGS": "cache"})
    assert "unreadable graph cache entry" in err
    assert stats["graph_cache_hits"] == 0
    again, _ = _run(tmp_path, seed=5)
    assert again["graph_cache_hits"] == 2


def test_key_follows_settings_that_change_code(tmp_path):
    import torch

    import kiln
    from kiln.runtime import graph_cache

    def f(x):
        return (x * 2).sum(0)

    with kiln.config.patch(cache_dir=str(tmp_path), graph_cache=True):
        x = torch.randn(8, 4)
        assert torch.allclose(kiln.compile(f)(x), f(x))
        assert kiln.stats()["graph_cache_hits"] == 0
        kiln.reset()
        assert torch.allclose(kiln.compile(f)(x), f(x))
        assert kiln.stats()["graph_cache_hits"] == 1
        kiln.reset()
        with kiln.config.patch(reuse_buffers=False):
            assert torch.allclose(kiln.compile(f)(x), f(x))
        assert kiln.stats()["graph_cache_hits"] == 0
        kiln.reset()
        # explain watches every stage: it never takes a compiled graph from the cache
        out = kiln.explain(f)(x)
        assert out.kernel_count >= 1 and kiln.stats()["graph_cache_hits"] == 0
    assert graph_cache.kiln_source_digest() == graph_cache.kiln_source_digest()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cached_graph_matches_eager_per_dtype(tmp_path, dtype):
    import torch

    import kiln
    from tests.testing import assert_close

    def f(x, y):
        return torch.relu(x + y) * x.sum(-1, keepdim=True)

    dt = getattr(torch, dtype)
    with kiln.config.patch(cache_dir=str(tmp_path), graph_cache=True):
        for i in range(2):
            kiln.reset()
            x = torch.randn(7, 5, dtype=dt).t()   # non-contiguous
            y = torch.randn(7, dtype=dt)          # broadcast
            assert_close(kiln.compile(f)(x, y), f(x, y), dt)
            assert kiln.stats()["graph_cache_hits"] == i


def _rewrite(entry, rec):
    data = json.dumps(rec).encode()
    with open(entry, "wb") as f:
        f.write(data)
    with open(entry + ".sha256", "w") as f:
        f.write(hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("saved", [["no_such_node"], [], None])
def test_bad_partition_entry_is_rebuilt_and_correct(tmp_path, saved):
    """An entry naming a node the joint graph lacks, one whose saved set leaves the backward
    reading an unsaved value, and a torn one: each is logged, recomputed (the training step
    still matches eager: SCRIPT checks it) and rewritten."""
    _run(tmp_path)
    [entry] = _entries(tmp_path, "partitions")
    with open(entry) as f:
        good = json.load(f)
    assert good["saved"], "the test needs a graph that saves something"
    if saved is None:
        with open(entry, "r+b") as f:
            f.truncate(5)
    else:
        _rewrite(entry, {"format": 1, "saved": saved})
    stats, err = _run(tmp_path, seed=6, extra_env={"KILN_LOGS": "cache"})
    assert stats["partition_cache_hits"] == 0
    assert ("corrupt cache entry" if saved is None else "unusable partition cache entry") in err
    with open(entry) as f:
        assert json.load(f) == good  # recomputed and stored again
    again, _ = _run(tmp_path, seed=7)
    assert again["partition_cache_hits"] == 1


def test_partition_key_follows_shapes_and_dtypes(tmp_path):
    import torch

    import kiln

    def f(x, w):
        return torch.tanh(x @ w).sum()

    with kiln.config.patch(cache_dir=str(tmp_path), graph_cache=True):
        for i, (n, dtype, hits) in enumerate([(4, torch.float32, 0), (4, torch.float32, 1),
                                               (6, torch.float32, 0), (4, torch.float64, 0)]):
            kiln.reset()
            x = torch.randn(n, 3, dtype=dtype, requires_grad=True)
            w = torch.randn(3, 5, dtype=dtype, requires_grad=True)
            out = kiln.compile(f)(x, w)
            out.backward()
            gx, gw = x.grad, w.grad
            x.grad = w.grad = None
            ref = f(x, w)
            ref.backward()
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close((gx, gw), (x.grad, w.grad))
            assert kiln.stats()["partition_cache_hits"] == hits, (i, n, dtype)
