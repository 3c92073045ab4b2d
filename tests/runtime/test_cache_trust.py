"""The cache's trust model: anyone who can write the cache can run code as you, so kiln makes
its folders 0700 and files 0600 whatever the umask, and refuses (with one warning naming the
path and the reason) a cache another user owns or others can write, compiling into a private
temporary cache instead. The planted entries here are written as another user (uid 65534,
through ``setpriv``) and would run code in the victim's process if they were trusted."""
import functools
import glob
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings

import pytest
import torch

import kiln
from kiln.runtime import cache, cpp_pch
from tests.testing import config_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="planting files as another user needs root and setpriv")


@functools.lru_cache(maxsize=1)
def _nobody_python() -> str:
    """An interpreter the other user can start: the planting script needs only the standard
    library, and this test's own interpreter may live where that user cannot read (a pyenv
    build under /root cannot load its libpython as nobody)."""
    for exe in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if exe and subprocess.run(SETPRIV + [exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    pytest.skip("no Python interpreter that the other user can run")


def _f(x, b):
    return torch.relu(x + b) * 2


def test_every_folder_and_file_is_private_whatever_the_umask(tmp_path):
    root = tmp_path / "a" / "b" / "kiln"  # kiln makes the parents too
    old = os.umask(0)
    try:
        kiln.reset()
        with kiln.config.patch(cache_dir=str(root), graph_cache=True, cpp_pch=True):
            x, b = torch.randn(8, 4), torch.randn(4)
            torch.testing.assert_close(kiln.compile(_f)(x, b), _f(x, b))
            # the precompiled prelude's folder and files too (built here, not waited for: on a
            # loaded host its niced background build can take minutes)
            assert os.path.exists(cpp_pch._ready_or_build(cpp_pch._key("base"), "base"))
            kiln.reset()
            torch.testing.assert_close(kiln.compile(lambda x: (x * 3).sum(0))(x), (x * 3).sum(0))
    finally:
        os.umask(old)
    made = [tmp_path / "a", tmp_path / "a" / "b"]
    for d, dirs, files in os.walk(tmp_path / "a"):
        made += [os.path.join(d, x) for x in dirs + files]
    assert len(made) > 10
    bad = []
    for p in made:
        try:  # (a background header build's temporary folder may go meanwhile)
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_IMODE(st.st_mode) != (0o700 if stat.S_ISDIR(st.st_mode) else 0o600):
            bad.append(f"{p}: {stat.S_IMODE(st.st_mode):o}")
    assert not bad, bad


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


def _run(cache_dir):
    from kiln.runtime.graph_cache import kiln_source_digest
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(cache_dir), _KILN_TEST_SOURCE_DIGEST=kiln_source_digest(),
                          PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
                     cpu_backend="cpp", graph_cache=True, cpp_pch=False)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


PLANT = textwrap.dedent("""
    import hashlib, json, os, sys
    files = json.load(sys.stdin)
    for rel, data in sorted(files.items()):
        path = os.path.join(sys.argv[1], rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = data.encode("latin-1")
        with open(path, "wb") as f:
            f.write(data)
        with open(path + ".sha256", "w") as f:
            f.write(hashlib.sha256(data).hexdigest())
""")

EVIL_CTOR = """
#include <cstdio>
__attribute__((constructor)) static void kiln_planted() {
    FILE* f = std::fopen("%s", "w"); if (f) { std::fputs("so", f); std::fclose(f); }
}
"""


def _planted_files(good, marker):
    """A good cache's graph and kernel entries, each made to leave a mark when loaded: the
    wrapper writes ``marker``.wrapper when exec'd, the shared object ``marker``.so when mapped
    (and still computes the right answer, so nothing would show)."""
    files = {}
    [entry] = glob.glob(str(good / "graphs" / "*" / "*.json"))
    rec = json.loads(open(entry).read())
    rec["wrapper"] = f"open({marker + '.wrapper'!r}, 'w').write('wrapper')\n" + rec["wrapper"]
    files[os.path.relpath(entry, good)] = json.dumps(rec)
    [so] = glob.glob(str(good / "cpp" / "*" / "*.so"))
    src = os.path.join(os.path.dirname(marker), "evil.cpp")
    with open(src, "w") as f:
        f.write(rec["kernels"][0]["source"] + EVIL_CTOR % (marker + ".so"))
    out = src[:-4] + ".so"
    subprocess.run([kiln.config.cpp_compiler, "-O1", "-shared", "-fPIC", "-fopenmp", src, "-o", out], check=True)
    files[os.path.relpath(so, good)] = open(out, "rb").read().decode("latin-1")
    return files


@pytest.fixture
def world():
    """A folder every user can reach (tmp_path is the victim's own, 0700)."""
    d = tempfile.mkdtemp(prefix="kiln-trust-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("where", ["root", "inside"])
def test_a_cache_planted_by_another_user_is_refused(tmp_path, world, where):
    good = tmp_path / "good"
    first = _run(good)
    assert first["graph_cache_hits"] == 0
    assert _run(good)["graph_cache_hits"] == 1  # the entries are hits for any cache folder
    marker = os.path.join(world, "ran")
    files = _planted_files(good, marker)
    planted = os.path.join(world, "cache")
    os.chmod(world, 0o777)
    subprocess.run(SETPRIV + [_nobody_python(), "-c", PLANT, planted], input=json.dumps(files), text=True, check=True)
    os.chmod(world, 0o755)
    assert os.stat(planted).st_uid == NOBODY
    if where == "inside":  # the victim's own private root, with another user's folders inside
        os.chown(planted, 0, 0)
        os.chmod(planted, 0o700)
    stats = _run(planted)
    assert not os.path.exists(marker + ".wrapper") and not os.path.exists(marker + ".so"), \
        "kiln ran code another user planted in its cache"
    [warning] = [w for w in stats["warnings"] if "refusing the compile cache" in w]
    assert (planted if where == "root" else os.path.join(planted, "")) in warning
    assert f"owned by uid {NOBODY}" in warning and "private temporary cache" in warning
    assert stats["fallbacks"] == 0 and stats["kernel_builds"] == 1  # compiled, privately
    assert stats["graph_cache_hits"] == 0


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_cache_others_can_write_is_refused(tmp_path, mode):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, mode)
    getattr(cache, "reset_trust", lambda: None)()  # (kiln.reset forgets them too)
    kiln.reset()
    with kiln.config.patch(cache_dir=str(root), graph_cache=True, cpp_pch=False):
        x, b = torch.randn(8, 4), torch.randn(4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.testing.assert_close(kiln.compile(_f)(x, b), _f(x, b))
        msgs = [str(w.message) for w in caught if "refusing" in str(w.message)]
        assert len(msgs) == 1, [str(w.message) for w in caught]
        assert str(root) in msgs[0] and "writable by" in msgs[0] and f"{mode:o}" in msgs[0]
        assert cache.cache_root() != str(root)
    assert os.listdir(root) == []  # nothing written where others could change it
    getattr(cache, "reset_trust", lambda: None)()  # (kiln.reset forgets them too)
