"""Several C++ kernels built by one gcc run (runtime/cpp_build.build_missing): results match
eager, each kernel keeps its own cache entry (the shared object, hard-linked), a later process
loads them from disk and builds nothing, and a batch that fails leaves each kernel to its own
build, which reports the broken one."""
import ctypes
import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.inductor.codegen.cpp import PRELUDE
from kiln.runtime import cpp_build, cpp_pch
from tests.testing import assert_close, config_env


def _two_reductions(x, y):
    # two reductions over different dims of different inputs: two kernels
    return (x.exp() * 2).sum(0), torch.softmax(y, -1)


def _entries(cache_dir):
    return sorted(glob.glob(os.path.join(str(cache_dir), "cpp", "*", "*.so")))


def _links_work(d) -> bool:
    """Hard links in this file system (else the entries are copies: the same bytes, other inodes)."""
    a, b = os.path.join(str(d), ".link-probe-a"), os.path.join(str(d), ".link-probe-b")
    open(a, "w").close()
    try:
        os.link(a, b)
        return True
    except OSError:
        return False
    finally:
        for p in (a, b):
            if os.path.exists(p):
                os.unlink(p)


def _objects(entries, d) -> int:
    """How many distinct shared objects the entries are (by inode, or by bytes without links)."""
    if _links_work(d):
        return len({os.stat(p).st_ino for p in entries})
    return len({open(p, "rb").read() for p in entries})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_of_a_graph_share_one_object_and_match_eager(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "cpu_backend", "cpp")
    monkeypatch.setattr(kiln.config, "compile_threads", 1)  # one gcc run at a time: one batch
    cpp_build.clear_memory()
    x = torch.randn(12, 7, dtype=dtype).t()  # non-contiguous
    y = torch.randn(5, 9, dtype=dtype)
    ex = kiln.explain(_two_reductions)(x, y)
    kinds = {cpp_pch._kind(k.source) for k in ex.kernels}  # bf16 kernels may include intrinsics
    out = ex.result
    ref = _two_reductions(x.float(), y.float())
    for o, r in zip(out, ref):
        assert o.dtype == dtype
        assert_close(o.float(), r.to(dtype).float(), dtype)
    stats = kiln.stats()
    assert stats["kernels_generated"] >= 2 and stats["kernel_builds"] == stats["kernels_generated"]
    entries = _entries(tmp_path)
    assert len(entries) == stats["kernel_builds"]
    # one object per kind of prelude, linked under each kernel's key
    assert _objects(entries, tmp_path) == len(kinds)
    # each entry is a cache entry of its own: digest beside it
    assert all(os.path.exists(p + ".sha256") for p in entries)


def test_off_switch_builds_each_kernel_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "cpu_backend", "cpp")
    monkeypatch.setattr(kiln.config, "cpp_batch_builds", False)
    cpp_build.clear_memory()
    x, y = torch.randn(6, 4), torch.randn(3, 8)
    out = kiln.compile(_two_reductions)(x, y)
    for o, r in zip(out, _two_reductions(x, y)):
        assert_close(o, r)
    entries = _entries(tmp_path)
    assert len(entries) >= 2 and _objects(entries, tmp_path) == len(entries)


SCRIPT = textwrap.dedent("""
    import json, torch, kiln
    def f(x, y):
        return (x.exp() * 2).sum(0), torch.softmax(y, -1)
    x, y = torch.randn(8, 5), torch.randn(4, 6)
    out = kiln.compile(f)(x, y)
    for o, r in zip(out, f(x, y)):
        torch.testing.assert_close(o, r)
    print(json.dumps(kiln.stats()))
""")


def _run(cache_dir):
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_COMPILE_THREADS="1"), cpu_backend="cpp")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_kernel_from_disk(tmp_path):
    first = _run(tmp_path)
    n = first["kernels_generated"]
    assert n >= 2 and first["kernel_builds"] == n and first["disk_cache_hits"] == 0
    second = _run(tmp_path)
    assert second["kernel_builds"] == 0 and second["disk_cache_hits"] == n
    # a torn entry: every kernel linked to that object is found corrupt and built again
    (so, *_) = _entries(tmp_path)
    with open(so, "r+b") as f:
        f.truncate(100)
    third = _run(tmp_path)
    assert third["kernel_builds"] == n and third["disk_cache_hits"] == 0
    assert _run(tmp_path)["kernel_builds"] == 0


def _kernel(name, body):
    return PRELUDE + f'\nextern "C" void {name}(float* out) {{ {body} }}\n'


def test_a_batch_that_fails_leaves_each_kernel_to_its_own_build(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    cpp_build.clear_memory()
    good = [_kernel("kiln_kernel0", "out[0] = 1.5f;"), _kernel("kiln_kernel1", "out[0] = 2.5f;")]
    bad = _kernel("kiln_kernel2", "out[0] = not_declared_anywhere;")
    assert cpp_build.build_missing(good + [bad], workers=1) == 0  # one batch, which fails
    assert _entries(tmp_path) == []
    for src, name, want in ((good[0], "kiln_kernel0", 1.5), (good[1], "kiln_kernel1", 2.5)):
        fn = getattr(cpp_build.load_cpp(src), name)
        out = torch.zeros(1)
        fn(ctypes.c_void_p(out.data_ptr()))
        assert out.item() == want
    with pytest.raises(cpp_build.CppBuildError, match="not_declared_anywhere"):
        cpp_build.load_cpp(bad)


def test_kernels_with_the_same_helper_names_stay_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    cpp_build.clear_memory()
    srcs = [PRELUDE + f'\nstatic float helper() {{ return {v}.0f; }}\n'
            f'extern "C" void kiln_kernel{i}(float* out) {{ out[0] = helper(); }}\n'
            for i, v in enumerate((3, 4, 5))]
    assert cpp_build.build_missing(srcs, workers=1) == 3
    for i, src in enumerate(srcs):
        out = torch.zeros(1)
        getattr(cpp_build.load_cpp(src), f"kiln_kernel{i}")(ctypes.c_void_p(out.data_ptr()))
        assert out.item() == 3 + i


def test_as_many_batches_as_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    cpp_build.clear_memory()
    srcs = [_kernel(f"kiln_kernel{i}", f"out[0] = {i}.0f;") for i in range(5)]
    assert cpp_build.build_missing(srcs, workers=2) == 5
    assert _objects(_entries(tmp_path), tmp_path) == 2
    assert cpp_build.build_missing(srcs, workers=2) == 0  # all loaded now


def test_split_is_balanced_and_bounded():
    items = [(f"k{i}", "x" * (10 * (i % 7) + 1)) for i in range(40)]
    for workers in (1, 2, 5):
        batches = cpp_build._split(items, workers)
        assert sorted(k for b in batches for k, _ in b) == sorted(k for k, _ in items)
        assert all(1 <= len(b) <= cpp_build.BATCH_MAX for b in batches)
        assert len(batches) >= min(workers, len(items))
    assert len(cpp_build._split(items[:3], 8)) == 3
    assert cpp_build._split([], 2) == []


def test_trouble_in_the_batched_build_leaves_each_kernel_to_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "cpu_backend", "cpp")
    cpp_build.clear_memory()

    def broken(*a, **k):
        raise OSError("no space left on device")
    monkeypatch.setattr(cpp_build, "_build_batch", broken)
    x, y = torch.randn(6, 4), torch.randn(3, 8)
    out = kiln.compile(_two_reductions)(x, y)
    for o, r in zip(out, _two_reductions(x, y)):
        assert_close(o, r)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["kernel_builds"] == stats["kernels_generated"] >= 2
