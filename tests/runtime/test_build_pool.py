"""The build pool: C++ builds of one compile run concurrently; the worker processes build C++
and (for a GPU target, which needs no GPU to compile) Triton binaries into the disk caches;
progress shows on a terminal only."""
import ctypes
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import kiln
from kiln.runtime import cache, pool
from tests.testing import assert_close


@pytest.fixture(autouse=True, params=[True, False], ids=["forked", "own-process"])
def _worker_kind(request):
    """Every test with workers forked by the zygote (KILN_CONFIG=worker_fork=1) and without."""
    with kiln.config.patch(worker_fork=request.param):
        yield


def _many_kernels(x, y):
    a = torch.relu(x + y)
    b = a.sum(0)          # a reduction: its own kernel
    c = torch.sigmoid(x.t() @ a)
    return b * 2, c.amax(-1), (x * y).cumsum(0)


def test_pool_builds_a_compile_s_cpp_kernels(tmp_path):
    x = torch.randn(6, 9).t()  # non-contiguous [9, 6]
    y = torch.randn(6)                          # broadcast
    with kiln.config.patch(cache_dir=str(tmp_path), compile_threads=2):
        p = pool.get_pool()
        assert p is not None and p.size == 2
        outs = kiln.compile(_many_kernels)(x, y)
        built = kiln.stats()["kernel_builds"]
        assert built >= 2
        for got, want in zip(outs, _many_kernels(x, y)):
            assert_close(got, want, torch.float32)
        kiln.reset()
        with kiln.config.patch(compile_threads=1):  # in-process, one at a time: same kernels, from disk
            assert pool.get_pool() is None
            outs = kiln.compile(_many_kernels)(x, y)
        assert kiln.stats()["kernel_builds"] == 0 and kiln.stats()["disk_cache_hits"] >= built
        for got, want in zip(outs, _many_kernels(x, y)):
            assert_close(got, want, torch.float32)


def test_worker_process_builds_a_cpp_entry(tmp_path):
    source = 'extern "C" int kiln_answer() { return 42; }\n'
    so_path = str(tmp_path / "ab" / "answer.so")
    p = pool.BuildPool(2)
    try:
        reply = p.in_worker({"kind": "cpp", "source": source, "so_path": so_path,
                             "cmd": [kiln.config.cpp_compiler, "-O1", "-shared", "-fPIC"]})
        assert reply["ok"] and reply["seconds"] > 0
        assert cache.valid_entry(so_path)  # the digest sidecar matches
        assert ctypes.CDLL(so_path).kiln_answer() == 42
        with pytest.raises(pool.BuildError, match="g.. failed"):
            p.in_worker({"kind": "cpp", "source": "not c++", "so_path": so_path + "x",
                         "cmd": [kiln.config.cpp_compiler, "-shared", "-fPIC"]})
        # a failed request leaves the worker usable
        assert p.in_worker({"kind": "ping"})["ok"]
    finally:
        p.shutdown()


def _nvidia_backend():
    try:
        import triton
        d = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        return os.path.exists(os.path.join(d, "ptxas"))
    except Exception:  # noqa: BLE001
        return False


KERNEL = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def kiln_kernel0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * 2, xmask)
""")

# The parent's side of the key: the JIT itself, with real torch tensors, on the same target
CHECK = textwrap.dedent("""
    import importlib.util, os, sys, torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    class D:
        def get_current_device(self): return 0
        def get_current_stream(self, d=None): return 0
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
    driver.set_active(D())
    spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
    m = importlib.util.module_from_spec(spec); sys.modules[sys.argv[2]] = m; spec.loader.exec_module(m)
    x = torch.empty(64, dtype=getattr(torch, sys.argv[3]))
    m.kiln_kernel0.warmup(x, x, 4096, XBLOCK=1024, grid=(1,), num_warps=4)
""")


@pytest.mark.skipif(not _nvidia_backend(), reason="Triton's CUDA backend (ptxas) is not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool"])
def test_worker_compiles_triton_ahead_under_the_key_the_launch_uses(tmp_path, dtype):
    path = tmp_path / "k.py"
    path.write_text(KERNEL)
    tcache = tmp_path / "triton_bin"
    env = dict(os.environ, TRITON_CACHE_DIR=str(tcache))
    env.pop("TRITON_INTERPRET", None)
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tcache)  # workers take the parent's environment
    p = pool.BuildPool(2)
    try:
        reply = p.in_worker({"kind": "triton", "path": str(path), "module": "kiln_triton_test",
                             "name": "kiln_kernel0", "target": ["cuda", 90, 32],
                             "args": [["ptr", dtype, 16], ["ptr", dtype, 16], ["int", 4096]],
                             "kwargs": {"XBLOCK": 1024, "num_warps": 4}})
        assert reply["ok"]
        assert not p.in_worker({"kind": "ping"})["torch_loaded"]  # the build kept torch out
    finally:
        p.shutdown()
        if old is None:
            os.environ.pop("TRITON_CACHE_DIR")
        else:
            os.environ["TRITON_CACHE_DIR"] = old
    entries = set(os.listdir(tcache))
    assert any(f.endswith(".cubin") for d in entries for f in os.listdir(tcache / d))
    # the JIT, given real tensors, finds that binary: it writes no new cache entry
    proc = subprocess.run([sys.executable, "-c", CHECK, str(path), "kiln_triton_test", dtype],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert set(os.listdir(tcache)) == entries


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_only(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with kiln.config.patch(progress_min=3):
        assert pool.run_jobs(lambda i: i * i, range(4)) == [0, 1, 4, 9]
        assert "kernels built 4/4" in term.getvalue() and term.getvalue().endswith("\n")
        term.truncate(0)
        pool.run_jobs(lambda i: i, range(2))  # too few to report
        assert term.getvalue().strip("\x00") == ""
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    with kiln.config.patch(progress_min=1):
        pool.run_jobs(lambda i: i, range(5))
    assert quiet.getvalue() == ""


def _until_started(p, n, timeout=60.0):
    """Prestarted workers come up in their own threads: wait for n of them (at most timeout)."""
    end = time.monotonic() + timeout
    while len(p._all) < n and time.monotonic() < end:
        time.sleep(0.01)


def test_prestart_starts_every_worker_at_once_and_never_more_than_the_size():
    p = pool.BuildPool(3)
    try:
        p.prestart(triton=False)
        p.prestart(triton=False)  # already full: starts nothing
        # requests made while the workers are still starting wait for one of them
        replies = p.map(lambda i: p.in_worker({"kind": "ping"}), range(8))
        assert all(r["ok"] for r in replies)
        _until_started(p, 3)  # forked workers (config.worker_fork) can answer all 8 before the rest connect
        assert len(p._all) == 3 and p._count == 3
        pids = {w.proc.pid for w in p._all}
        p.map(lambda i: p.in_worker({"kind": "ping"}), range(6))
        assert {w.proc.pid for w in p._all} == pids  # the same three serve every request
    finally:
        p.shutdown()


def test_a_dead_worker_is_replaced():
    p = pool.BuildPool(1)
    try:
        assert p.in_worker({"kind": "ping"})["ok"]
        (w,) = p._all
        w.proc.kill()
        w.proc.wait()
        assert p.in_worker({"kind": "ping"})["ok"]  # a new worker took its place
        assert len(p._all) == 1 and p._all[0] is not w
    finally:
        p.shutdown()


def test_a_worker_keeps_torch_out():
    """Importing torch costs a fresh worker seconds; Triton's specializer would import it."""
    p = pool.BuildPool(1)
    try:
        assert p.in_worker({"kind": "ping", "triton": True})["torch_loaded"] is False
    finally:
        p.shutdown()


def test_prestart_can_start_a_few_first_and_the_rest_later():
    p = pool.BuildPool(3)
    try:
        p.prestart(count=2)  # before capture: a few
        assert p._count == 2
        p.prestart()  # a graph-cache miss: the rest
        assert p._count == 3
        assert all(r["ok"] for r in p.map(lambda i: p.in_worker({"kind": "ping"}), range(4)))
        _until_started(p, 3)
        assert len(p._all) == 3
    finally:
        p.shutdown()


@pytest.mark.parametrize("nice, step", [(None, 10), (0, 0), (3, 3)])
def test_build_workers_run_nicer_than_the_compiler(monkeypatch, nice, step):
    """config.worker_nice (default 10): a worker's priority against the compiling process's."""
    if nice is not None:
        monkeypatch.setattr(kiln.config, "worker_nice", nice)
    w = pool.Worker()
    try:
        assert w.request({"kind": "ping"})["ok"]      # the worker is up (its nice call done)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, w.proc.pid) == min(19, mine + step)
    finally:
        w.close()
