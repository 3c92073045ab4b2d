"""Build workers forked by one zygote process (``config.worker_fork``; kiln/runtime/pool.py
Zygote, build_worker.py --zygote): one import of Triton for the whole pool instead of one per
worker, the same protocol over a Unix socket, and a fallback to workers of their own."""
import ctypes
import os
import subprocess
import sys
import time

import pytest

import kiln
from kiln import log
from kiln.runtime import cache, pool
from tests.runtime.test_build_pool import CHECK, KERNEL, _nvidia_backend

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks: Linux only")


@pytest.fixture
def forked():
    with kiln.config.patch(worker_fork=True):
        p = pool.BuildPool(3)
        try:
            yield p
        finally:
            p.shutdown()


def _cpp(i, tmp_path):
    return {"kind": "cpp", "source": f'extern "C" int kiln_answer() {{ return {i}; }}\n',
            "so_path": str(tmp_path / f"{i}" / "answer.so"), "cmd": [kiln.config.cpp_compiler, "-O1", "-shared", "-fPIC"]}


def test_forked_workers_build_concurrently_and_keep_torch_out(forked, tmp_path):
    forked.prestart(triton=True)
    replies = forked.map(lambda i: forked.in_worker(_cpp(i, tmp_path)), range(6))
    assert all(r["ok"] for r in replies)
    for i in range(6):
        so = str(tmp_path / f"{i}" / "answer.so")
        assert cache.valid_entry(so) and ctypes.CDLL(so).kiln_answer() == i
    assert forked.in_worker({"kind": "ping", "triton": True})["torch_loaded"] is False
    workers = list(forked._all)
    assert len(workers) == 3 and all(isinstance(w, pool.ForkedWorker) for w in workers)
    pids = {w.proc.pid for w in workers}
    assert len(pids) == 3 and os.getpid() not in pids and forked._zygote.proc.pid not in pids
    with pytest.raises(pool.BuildError, match="g.. failed"):  # a failure comes back as before
        forked.in_worker(dict(_cpp(9, tmp_path), source="not c++"))
    assert forked.in_worker({"kind": "ping"})["ok"]


def test_a_forked_worker_runs_nicer_than_the_compiler(monkeypatch, forked):
    assert forked.in_worker({"kind": "ping"})["ok"]
    (w,) = forked._all
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, w.proc.pid) == min(19, mine + 10)


def test_a_dead_forked_worker_is_replaced(forked):
    assert forked.in_worker({"kind": "ping"})["ok"]
    (w,) = forked._all
    w.proc.kill()
    assert w.proc.wait() is not None  # gone: the zygote reaped it
    assert not w.alive()
    assert forked.in_worker({"kind": "ping"})["ok"]
    assert len(forked._all) == 1 and forked._all[0] is not w and forked._all[0].proc.pid != w.proc.pid


def test_shutdown_ends_the_zygote_and_its_workers():
    with kiln.config.patch(worker_fork=True):
        p = pool.BuildPool(2)
        p.prestart()
        assert all(r["ok"] for r in p.map(lambda i: p.in_worker({"kind": "ping"}), range(4)))
        end = time.monotonic() + 60
        while len(p._all) < 2 and time.monotonic() < end:  # the second may still be connecting
            time.sleep(0.01)
        assert len(p._all) == 2
        procs = [w.proc for w in p._all] + [p._zygote.proc]
        sock_dir = p._zygote.dir
        p.shutdown()
    end = time.monotonic() + 10
    while any(pr.poll() is None for pr in procs) and time.monotonic() < end:
        time.sleep(0.02)
    assert all(pr.poll() is not None for pr in procs)
    assert not os.path.exists(sock_dir)


def test_a_zygote_that_fails_leaves_workers_of_their_own(monkeypatch, capsys):
    class Broken:
        def __init__(self):
            raise OSError("no sockets here")
    monkeypatch.setattr(pool, "Zygote", Broken)
    log.configure("kernels")
    try:
        with kiln.config.patch(worker_fork=True):
            p = pool.BuildPool(2)
            try:
                assert p.in_worker({"kind": "ping"})["ok"]
                assert all(type(w) is pool.Worker for w in p._all)
            finally:
                p.shutdown()
    finally:
        log.configure("")
    assert "the zygote failed (OSError: no sockets here)" in capsys.readouterr().err


def test_a_zygote_that_exits_leaves_workers_of_their_own(forked):
    assert forked.in_worker({"kind": "ping"})["ok"]
    forked._zygote.proc.kill()
    forked._zygote.proc.wait()
    assert forked._reserve(1) == 1
    w = forked._start()  # the next worker the pool would start
    assert type(w) is pool.Worker and forked._zygote_failed
    assert w.request({"kind": "ping"})["ok"]
    assert forked.in_worker({"kind": "ping"})["ok"]


@pytest.mark.skipif(not _nvidia_backend(), reason="Triton's CUDA backend (ptxas) is not installed")
def test_a_forked_worker_compiles_triton_under_the_key_the_launch_uses(tmp_path, monkeypatch):
    """The zygote imported Triton (and computed its cache key) before forking: the child's
    binary must land under the key the parent's JIT computes, as a worker of its own does."""
    path = tmp_path / "k.py"
    path.write_text(KERNEL)
    tcache = tmp_path / "triton_bin"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tcache))  # workers take the parent's environment
    with kiln.config.patch(worker_fork=True):
        p = pool.BuildPool(2)
        try:
            p.prestart(triton=True)
            reply = p.in_worker({"kind": "triton", "path": str(path), "module": "kiln_triton_test",
                                 "name": "kiln_kernel0", "target": ["cuda", 90, 32],
                                 "args": [["ptr", "float32", 16], ["ptr", "float32", 16], ["int", 4096]],
                                 "kwargs": {"XBLOCK": 1024, "num_warps": 4}})
            assert reply["ok"], reply
            assert all(isinstance(w, pool.ForkedWorker) for w in p._all)
        finally:
            p.shutdown()
    entries = set(os.listdir(tcache))
    assert any(f.endswith(".cubin") for d in entries for f in os.listdir(tcache / d))
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", CHECK, str(path), "kiln_triton_test", "float32"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert set(os.listdir(tcache)) == entries  # the JIT found the forked worker's binary
