"""Builds are bounded (``config.build_timeout``): a compiler that hangs is killed, one that is
killed is named as such, and the graph falls back with a one-line warning naming the kernel,
the cause and the dump of the source."""
import os
import re
import time
import warnings

import pytest
import torch

import kiln
from kiln.runtime import pool

FAKE = """#!/bin/sh
case "$1" in --version) echo "fake-cxx 1.0"; exit 0;; esac
echo $$ >> {pids}
{action}
"""


def _fake_compiler(tmp_path, action):
    path = tmp_path / "fake-g++"
    path.write_text(FAKE.format(pids=tmp_path / "pids", action=action))
    path.chmod(0o700)
    return str(path)


def _f(x, y):
    return torch.relu(x + y) * 2, (x * y).sum(0)


def _compile_with(tmp_path, cxx, **cfg):
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    with kiln.config.patch(cpp_compiler=cxx, cpp_pch=False, graph_cache=False, cache_dir=str(tmp_path / "kc"), **cfg):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = kiln.compile(_f)(x, y)
        wall = time.perf_counter() - t0
    for got, want in zip(out, _f(x, y)):
        torch.testing.assert_close(got, want)
    msgs = [str(w.message) for w in caught if "eagerly" in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in caught]
    return msgs[0], wall


def _check_one_line(msg):
    # the eager-run warning (kiln/eager_runs.py): the cause on its first line, then the user's
    # source line that ran eagerly; no compiler source in it
    cause, _, rest = msg.partition("\n")
    assert "\n" not in rest.strip() and len(cause) < 600, msg
    msg = cause
    assert re.search(r"building kernel kiln_\w+", msg), msg
    dump = re.search(r"source in (\S+\.cpp)", msg).group(1)
    with open(dump) as f:
        assert 'extern "C"' in f.read()
    assert os.stat(dump).st_mode & 0o077 == 0


@pytest.mark.parametrize("batch", [True, False])
def test_a_killed_compiler_is_named_in_one_line(tmp_path, batch):
    msg, _ = _compile_with(tmp_path, _fake_compiler(tmp_path, "kill -9 $$"), cpp_batch_builds=batch)
    assert "killed by SIGKILL after" in msg, msg
    _check_one_line(msg)
    assert "#include" not in msg  # the source is in the dump, not in the warning


def test_a_hanging_compiler_is_timed_out(tmp_path):
    msg, wall = _compile_with(tmp_path, _fake_compiler(tmp_path, "sleep 60"), build_timeout=1.0)
    assert "timed out after 1.0 s" in msg, msg
    _check_one_line(msg)
    assert wall < 20  # one timeout (the batch), not one per kernel after it


def test_a_hanging_build_in_a_worker_is_killed_with_its_compiler(tmp_path):
    cxx = _fake_compiler(tmp_path, "sleep 60")
    p = pool.BuildPool(2)
    try:
        t0 = time.perf_counter()
        with pytest.raises(pool.BuildTimeout, match="timed out after 1 s"):
            p.in_worker({"kind": "cpp", "name": "kiln_kernel0", "source": "int x;", "cmd": [cxx],
                         "so_path": str(tmp_path / "ab" / "k.so")}, timeout=1.0)
        assert time.perf_counter() - t0 < 15
        pid = int((tmp_path / "pids").read_text().split()[0])
        for _ in range(100):  # the fake compiler went with its worker
            if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the worker's compiler {pid} still runs")
        assert p.in_worker({"kind": "ping"})["ok"]  # the pool goes on with a new worker
    finally:
        p.shutdown()
