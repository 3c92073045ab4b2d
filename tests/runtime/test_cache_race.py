"""Processes and threads building the same C++ kernels into one cache at once: every entry holds
a shared object that exports every symbol of its key's source, whoever wrote it and in whatever
order the stores land; a load checks the symbols it needs and evicts and rebuilds an entry that
lacks them (a warning naming the kernel), never failing the compile.

The race this guards against (seen as ``undefined symbol: kiln_kernel1`` on one rank of a
two-process DDP run): several kernels built by one gcc run were stored under the first kernel's
key and hard-linked to the others *from that shared path*, and the batch's library was opened
from it too. A process that stored its own object of the first kernel alone in between (another
graph, or a pool of another size, splits its batches differently) had its object linked under
the other kernels' keys, and loaded for them."""
import ctypes
import hashlib
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.runtime import cache, cpp_build


def _pool_bn(x, w, b):
    # three C++ kernels, one of them the reduction's "_pre" prologue (scheduler.hoist_recomputed_prologues)
    return F.relu(F.batch_norm(F.max_pool2d(x, 3, 2, 1), None, None, w, b, training=True))


def _pool_bn2(x, w, b):
    return F.batch_norm(F.max_pool2d(x * 2, 3, 2, 1), None, None, w, b, training=True).tanh()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, 12, 12, generator=g), torch.randn(4, generator=g), torch.randn(4, generator=g))


def _exports(path: str):
    """``has(symbol)`` for the shared object at ``path``, opened through a private copy (dlopen
    answers a path it opened before with the library it mapped then)."""
    fd, copy = tempfile.mkstemp(suffix=".so")
    os.close(fd)
    shutil.copyfile(path, copy)
    try:
        lib = ctypes.CDLL(copy)

        def has(name):
            try:
                lib[name]
                return True
            except AttributeError:
                return False
        return has
    finally:
        os.unlink(copy)


def _assert_entries_whole(kernels):
    """Every kernel's disk entry verifies and exports every ``extern "C"`` symbol of its source."""
    for k in kernels:
        path = cpp_build._so_path(cpp_build._key(k.source))
        assert cache.valid_entry(path), (k.name, path)
        has = _exports(path)
        missing = [n for n in cpp_build._NAME.findall(k.source) if not has(n)]
        assert not missing, f"{path} (the entry of {k.name}) lacks {missing}"


def _kernels(cache_dir):
    """The C++ kernels of _pool_bn (each built alone into ``cache_dir``)."""
    with kiln.config.patch(cache_dir=str(cache_dir), cpu_backend="cpp", cpp_batch_builds=False, cpp_pch=False):
        r = kiln.explain(_pool_bn)(*_inputs())
    assert any(k.name.endswith("_pre") for k in r.kernels) and len(r.kernels) >= 3
    return r.kernels


def _compile_clean(fn, cache_dir, **patch):
    """kiln.compile(fn) against ``cache_dir`` in a fresh kiln state: matches eager, with no
    warning; returns kiln.stats()."""
    kiln.reset()
    x = _inputs(1)
    with kiln.config.patch(cache_dir=str(cache_dir), cpu_backend="cpp", cpp_pch=False, **patch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = kiln.compile(fn)(*x)
    torch.testing.assert_close(out, fn(*x))
    assert not [str(w.message) for w in caught if "kiln" in str(w.message)]
    return kiln.stats()


def test_a_store_landing_between_a_batch_and_its_links_leaves_every_entry_whole(tmp_path, monkeypatch):
    """Another process's object of the batch's first kernel, built alone, lands right after the
    batch stored that kernel's entry: the other kernels' entries and loaded functions are still
    the batch's, which has their symbols."""
    kernels = _kernels(tmp_path / "alone")
    with kiln.config.patch(cache_dir=str(tmp_path / "alone")):
        alone = {cpp_build._so_path(cpp_build._key(k.source)): k for k in kernels}
        alone = {os.path.basename(p): open(p, "rb").read() for p in alone}
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path / "shared"))
    monkeypatch.setattr(kiln.config, "cpp_pch", False)
    cpp_build.clear_memory()
    real_replace, landed = os.replace, []

    def replace(src, dst, *a, **kw):
        real_replace(src, dst, *a, **kw)
        entry = str(dst)[:-len(".sha256")]
        if not landed and str(dst).endswith(".so.sha256") and os.path.basename(entry) in alone:
            data = alone[os.path.basename(entry)]  # "the other process" stores its own object
            for path, payload in ((entry, data), (str(dst), hashlib.sha256(data).hexdigest().encode())):
                with open(path + ".other", "wb") as f:
                    f.write(payload)
                real_replace(path + ".other", path)
            landed.append(entry)
    monkeypatch.setattr(os, "replace", replace)
    assert cpp_build.build_missing([k.source for k in kernels], workers=1) == len(kernels)
    monkeypatch.setattr(os, "replace", real_replace)
    assert landed, "the batch never stored an entry"
    for k in kernels:  # in this process: each kernel's function, from memory or its entry
        cpp_build.load_cpp_function(k.source, k.name, len(k.args), len(k.sizes))
    _assert_entries_whole(kernels)
    stats = _compile_clean(_pool_bn, tmp_path / "shared")  # a later process: disk hits only
    assert stats["kernel_builds"] == 0 and stats["disk_cache_hits"] == len(kernels)


def test_an_entry_lacking_its_kernel_is_evicted_and_rebuilt_with_a_warning(tmp_path, monkeypatch):
    """The entry of kiln_kernel1 holds a valid shared object with a matching digest that exports
    only kiln_kernel1_pre: the load names the kernel in a warning, evicts and rebuilds the entry
    in the same call (though this process mapped the bad object at that very path), and the
    compiled graph matches eager."""
    kernels = _kernels(tmp_path)
    pre = next(k for k in kernels if k.name.endswith("_pre"))
    main = next(k for k in kernels if k.name == pre.name[:-len("_pre")])
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "cpp_pch", False)
    path = cpp_build._so_path(cpp_build._key(main.source))
    with open(cpp_build._so_path(cpp_build._key(pre.source)), "rb") as f:
        cache.store(path, f.read())
    cpp_build.clear_memory()
    builds = kiln.stats()["kernel_builds"]
    with pytest.warns(RuntimeWarning, match=f"{main.name}.*lacks.*{main.name}"):
        fn = cpp_build.load_cpp_function(main.source, main.name, len(main.args), len(main.sizes))
    assert fn is not None and kiln.stats()["kernel_builds"] == builds + 1
    _assert_entries_whole(kernels)
    monkeypatch.undo()
    # a fresh kiln state on the healed cache: disk hits, the right answer, no warning
    stats = _compile_clean(_pool_bn, tmp_path)
    assert stats["kernel_builds"] == 0 and stats["fallbacks"] == 0


def test_a_compile_heals_an_entry_lacking_its_kernel(tmp_path):
    """Through kiln.compile: the poisoned entry is found, rebuilt, and the result is compiled
    (no fallback to eager), with one warning naming the kernel."""
    kernels = _kernels(tmp_path)
    pre = next(k for k in kernels if k.name.endswith("_pre"))
    main = next(k for k in kernels if k.name == pre.name[:-len("_pre")])
    with kiln.config.patch(cache_dir=str(tmp_path)):
        path = cpp_build._so_path(cpp_build._key(main.source))
        with open(cpp_build._so_path(cpp_build._key(pre.source)), "rb") as f:
            cache.store(path, f.read())
    kiln.reset()
    x = _inputs(2)
    with kiln.config.patch(cache_dir=str(tmp_path), cpu_backend="cpp", cpp_pch=False, cpp_batch_builds=False):
        with pytest.warns(RuntimeWarning, match=main.name) as caught:
            out = kiln.compile(_pool_bn)(*x)
    torch.testing.assert_close(out, _pool_bn(*x))
    assert not [w for w in caught if "eager" in str(w.message)]
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["kernel_builds"] == 1


# ---------------------------------------------------------------------- real races, stretched
def _jittered_replace(rng):
    """os.replace, then a random pause when it placed a kernel entry: stores, links and loads of
    racing builders interleave in many more ways than at full speed."""
    real = os.replace

    def replace(src, dst, *a, **kw):
        real(src, dst, *a, **kw)
        if f"{os.sep}cpp{os.sep}" in str(dst):
            time.sleep(rng.random() * 0.03)
    return replace


def test_threads_building_overlapping_batches_never_mix_objects(tmp_path, monkeypatch):
    """Three threads build the same kernels at once, each splitting them into batches its own
    way (one batch, two, one per kernel), then load every kernel: no load fails and every entry
    is whole. Repeated on fresh caches."""
    kernels = _kernels(tmp_path / "harvest")
    monkeypatch.setattr(kiln.config, "cpp_pch", False)
    monkeypatch.setattr(os, "replace", _jittered_replace(random.Random(0)))
    for rnd in range(3):
        monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path / f"round{rnd}"))
        cpp_build.clear_memory()
        errors, start = [], threading.Barrier(3)

        def build(workers):
            try:
                start.wait()
                cpp_build.build_missing([k.source for k in kernels], workers=workers)
                for k in kernels:
                    cpp_build.load_cpp_function(k.source, k.name, len(k.args), len(k.sizes))
            except Exception:  # noqa: BLE001 - reported below
                errors.append(traceback.format_exc())
        threads = [threading.Thread(target=build, args=(w,)) for w in (1, 2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        _assert_entries_whole(kernels)


def _race_worker(rank, base, kernels, rounds, barrier, queue):
    """One racing process (a build pool of rank + 1 threads, so each process splits the kernels
    into batches its own way): in each round, builds and loads ``kernels`` (name, source, number
    of pointer and size arguments) into the round's fresh cache; in a last round, compiles
    _pool_bn and _pool_bn2 whole (the graph cache on) and compares them with eager."""
    problems = []
    try:
        kiln.config.cpu_backend, kiln.config.cpp_pch = "cpp", False
        kiln.config.compile_threads = rank + 1
        rng = random.Random(rank)
        os.replace = _jittered_replace(rng)
        for rnd in range(rounds):
            kiln.config.cache_dir = os.path.join(base, f"round{rnd}")
            cpp_build.clear_memory()
            barrier.wait(timeout=120)
            time.sleep(rng.random() * 0.5)  # (each process a head start or a delay of its own)
            cpp_build.build_missing([src for _, src, _, _ in kernels], workers=rank + 1)
            for name, src, nargs, nsizes in kernels:
                cpp_build.load_cpp_function(src, name, nargs, nsizes)
        kiln.reset()
        kiln.config.cache_dir, kiln.config.graph_cache = os.path.join(base, "compile"), True
        x = _inputs(rank)
        barrier.wait(timeout=120)
        for fn in [_pool_bn, _pool_bn2][rank % 2:] + [_pool_bn, _pool_bn2][:rank % 2]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = kiln.compile(fn)(*x)
            if not torch.allclose(out, fn(*x), atol=1e-5, rtol=1e-4):
                problems.append(f"rank {rank} {fn.__name__}: wrong result")
            problems += [f"rank {rank} {fn.__name__}: {w.message}" for w in caught if "kiln" in str(w.message)]
    except Exception:  # noqa: BLE001 - reported by the test
        problems.append(f"rank {rank}: {traceback.format_exc()}")
    queue.put(problems)


def test_processes_building_the_same_kernels_into_one_fresh_cache(tmp_path):
    """Three processes (spawned) build and load the same kernels (a "_pre" prologue among them)
    into one fresh cache at the same moment, twice, then compile the same two graphs into
    another at once: no load fails, every result matches eager with no warning, and every entry
    left on disk is whole; a fresh kiln state then finds every kernel on disk."""
    kernels = _kernels(tmp_path / "harvest")
    specs = [(k.name, k.source, len(k.args), len(k.sizes)) for k in kernels]
    ctx = multiprocessing.get_context("spawn")
    n, rounds = 3, 2
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(r, str(tmp_path), specs, rounds, barrier, queue))
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        problems = [item for _ in procs for item in queue.get(timeout=300)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not problems, "\n".join(problems)
    for d in [f"round{r}" for r in range(rounds)] + ["compile"]:
        with kiln.config.patch(cache_dir=str(tmp_path / d)):
            _assert_entries_whole(kernels)
    stats = _compile_clean(_pool_bn, tmp_path / "round0")
    assert stats["kernel_builds"] == 0 and stats["disk_cache_hits"] == len(kernels), stats
