"""The disk cache heals itself: an entry whose digest matches but which does not load or run
is evicted on its first failure and rebuilt in the same call (a compiled result, no fallback);
stores and loads racing on one key never fail nor see a digest and content that disagree;
precompiled-header builds leave no temporary folders behind."""
import glob
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import kiln
from kiln.runtime import cache, graph_cache
from tests.testing import config_env


def _f(x, b):
    return torch.relu(x + b) * 2


def _run(tmp_path):
    """Compile and call _f with the graph cache in tmp_path; (stats, fallback warnings)."""
    kiln.reset()
    x, b = torch.randn(32, 16), torch.randn(16)
    with kiln.config.patch(cache_dir=str(tmp_path), graph_cache=True, cpp_pch=False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = kiln.compile(_f)(x, b)
    torch.testing.assert_close(out, _f(x, b))
    return kiln.stats(), [str(w.message) for w in caught if "eagerly" in str(w.message)]


def _poison(path, data: bytes | None):
    """Replace an entry with ``data`` (None: a directory) and a digest that matches it."""
    os.unlink(path)
    if data is None:
        os.mkdir(path)
        digest = hashlib.sha256(b"").hexdigest()
    else:
        with open(path, "wb") as f:
            f.write(data)
        digest = hashlib.sha256(data).hexdigest()
    with open(path + ".sha256", "w") as f:
        f.write(digest)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = textwrap.dedent("""
    import json, warnings, torch, kiln
    def f(x, b):
        return torch.relu(x + b) * 2
    x, b = torch.randn(32, 16), torch.randn(16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kiln.compile(f)(x, b)
    torch.testing.assert_close(out, f(x, b))
    print(json.dumps(dict(kiln.stats(), warnings=[str(w.message) for w in caught])))
""")


def _process(tmp_path):
    """_f's twin compiled in a new process (a shared object once mapped stays mapped)."""
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(tmp_path),
                          PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
                     cpu_backend="cpp", graph_cache=False, cpp_pch=False)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["garbage", "empty", "directory"])
def test_a_shared_object_that_does_not_load_is_rebuilt_in_the_same_call(tmp_path, kind):
    _process(tmp_path)
    [so] = glob.glob(str(tmp_path / "cpp" / "*" / "*.so"))
    _poison(so, {"garbage": b"\x7fELF not really" * 10, "empty": b"", "directory": None}[kind])
    stats = _process(tmp_path)
    assert stats["fallbacks"] == 0 and not stats["warnings"], stats
    assert stats["kernel_builds"] == 1  # rebuilt now, not left for the next process
    again = _process(tmp_path)
    assert again["kernel_builds"] == 0 and again["disk_cache_hits"] == 1


def _rewrite_wrapper(tmp_path, fn):
    [entry] = glob.glob(str(tmp_path / "graphs" / "*" / "*.json"))
    with open(entry) as f:
        rec = json.load(f)
    rec["wrapper"] = fn(rec["wrapper"])
    data = json.dumps(rec).encode()
    with open(entry, "wb") as f:
        f.write(data)
    with open(entry + ".sha256", "w") as f:
        f.write(hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("poison", [
    lambda src: src.replace("def call(", "def call(:", 1),                      # a syntax error
    lambda src: "raise RuntimeError('poisoned at exec')\n" + src,                 # raises when run
    lambda src: src + "\ndef call(*args):\n    raise RuntimeError('poisoned call')\n",  # its call raises
], ids=["syntax-error", "raises-on-exec", "call-raises"])
def test_a_wrapper_that_does_not_run_is_evicted_and_compiled_afresh(tmp_path, poison):
    _run(tmp_path)
    _rewrite_wrapper(tmp_path, poison)
    stats, fallbacks = _run(tmp_path)
    assert not fallbacks and stats["fallbacks"] == 0
    again, fallbacks = _run(tmp_path)  # the healed entry: a plain hit
    assert not fallbacks and again["graph_cache_hits"] == 1 and again["kernel_builds"] == 0


class _Wrapper:
    def __init__(self, source):
        self.source, self.size_args, self.externs = source, [], []


def test_racing_load_or_store_never_fails_nor_drops_a_good_entry(tmp_path, monkeypatch):
    """Eight threads load a graph entry, storing it when they miss, on 200 fresh keys at
    once each (the GIL switching every microsecond): no exception, every load is the entry or
    a miss, no reader takes a store in progress for a corrupt entry (and deletes it), and
    every entry is there at the end."""
    errors, seen, dropped = [], set(), []
    real_log = kiln.log.log

    def spy(channel, msg, *args):
        if "corrupt" in msg or "unreadable" in msg or "could not write" in msg:
            dropped.append(msg % args)
        real_log(channel, msg, *args)
    monkeypatch.setattr(kiln.log, "log", spy)
    source = "def call(x):\n    return x\n" + "# padding\n" * 500
    keys = [f"{i:02x}" * 32 for i in range(200)]
    barrier = threading.Barrier(8)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with kiln.config.patch(cache_dir=str(tmp_path)):
            def worker():
                for key in keys:
                    try:
                        barrier.wait()
                        hit = graph_cache.load(key)
                        if hit is None:
                            graph_cache.store(key, _Wrapper(source), {}, 0, {})
                        else:
                            seen.add(hit.source == source)
                    except threading.BrokenBarrierError:
                        return
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"{type(e).__name__}: {e}")
            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            missing = [k for k in keys if graph_cache.load(k) is None]
    finally:
        sys.setswitchinterval(interval)
    assert not errors, (len(errors), errors[:3])
    assert not dropped, (len(dropped), dropped[:2])
    assert seen == {True}
    assert not missing, f"{len(missing)} of {len(keys)} entries lost"


def test_racing_stores_of_different_bytes_keep_digest_and_content_together(tmp_path):
    path = str(tmp_path / "ab" / "entry.bin")
    bad = []
    with kiln.config.patch(cache_dir=str(tmp_path)):
        def writer(i):
            for step in range(150):
                cache.store(path, bytes([i]) * (1000 + step))

        def reader():
            for _ in range(300):
                with cache.reading(path) as ok:
                    if ok:
                        with open(path, "rb") as f:
                            data = f.read()
                        with open(path + ".sha256") as f:
                            if hashlib.sha256(data).hexdigest() != f.read():
                                bad.append(len(data))
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)] + \
            [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not bad
    assert cache.valid_entry(path)


SHORT = textwrap.dedent("""
    import torch, kiln
    from kiln.runtime import cpp_pch
    def f(x):
        return torch.sigmoid(x) * 3
    x = torch.randn(40)
    assert torch.allclose(kiln.compile(f)(x), f(x))
    cpp_pch.after_builds()   # a header build starts in the background; the process exits now
""")


def test_short_processes_leave_no_header_build_folders(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pch = tmp_path / "pch"
    pch.mkdir(mode=0o700)
    stale = pch / ".tmp-999999999-leftover"  # a process that was killed: no exit handler ran
    stale.mkdir()
    (stale / "kiln_prelude.h.gch").write_bytes(b"x" * 1000)
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(tmp_path),
                          PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")),
                     cpu_backend="cpp", graph_cache=False)
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", SHORT], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert not [p for p in os.listdir(pch) if p.startswith(".tmp-")], os.listdir(pch)
