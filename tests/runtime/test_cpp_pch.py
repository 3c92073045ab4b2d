"""The precompiled C++ prelude (runtime/cpp_pch.py): built after a build stage, then used by
later builds (same results); a corrupt header is rebuilt; a failing build gives it up and
builds from the plain source; KILN_CONFIG=cpp_pch=0 never uses it."""
import glob
import os

import pytest
import torch

import kiln
from kiln import log
from kiln.runtime import cpp_pch
from testing import assert_close


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "cpu_backend", "cpp")
    monkeypatch.setattr(kiln.config, "cpp_pch", True)
    cpp_pch.reset()
    log.configure("cache,+kernels")
    yield tmp_path
    log.configure("")
    cpp_pch.reset()


def _compile_and_check(scale, dtype=torch.float32):
    def f(x, b):  # no cancellation: bf16 eager rounds per op, kiln once
        return torch.relu(x * scale + b) * 0.5 + torch.tanh(x)
    x = torch.randn(16, 24, dtype=dtype).t()  # non-contiguous
    b = torch.randn(16, dtype=dtype)
    assert_close(kiln.compile(f)(x, b), f(x, b), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_later_builds_use_the_precompiled_prelude(fresh_cache, capsys, dtype):
    _compile_and_check(1.5, dtype)  # builds with the plain prelude, then starts the header
    assert cpp_pch.wait_ready() is not None
    for kind in sorted(cpp_pch._wanted):
        assert cpp_pch.wait_ready(kind=kind) is not None
    assert glob.glob(str(fresh_cache / "pch" / "*" / "kiln_prelude.h.gch"))
    kiln.reset()
    _compile_and_check(2.5, dtype)  # a new kernel: built with -include
    err = capsys.readouterr().err
    assert "precompiled the C++ prelude" in err and "(precompiled prelude)" in err


def test_a_corrupt_header_is_rebuilt(fresh_cache, capsys):
    _compile_and_check(1.5)
    assert cpp_pch.wait_ready() is not None
    (gch,) = glob.glob(str(fresh_cache / "pch" / "*" / "kiln_prelude.h.gch"))
    with open(gch, "r+b") as f:
        f.truncate(1000)
    cpp_pch.reset()
    kiln.reset()
    _compile_and_check(3.5)  # the torn header is found corrupt: no -include, rebuilt after
    assert cpp_pch.wait_ready() is not None
    assert os.path.getsize(gch) > 1000
    err = capsys.readouterr().err
    assert "corrupt cache entry" in err


def test_a_build_failing_with_the_header_falls_back(fresh_cache, monkeypatch, capsys):
    _compile_and_check(1.5)
    header = cpp_pch.wait_ready()
    assert header is not None
    # gcc skips an unusable .gch and parses the header itself: make both unusable
    with open(header + ".gch", "wb") as f:  # (with a matching digest)
        f.write(b"not a precompiled header")
    with open(header, "w") as f:
        f.write("#error a broken prelude\n")
    from kiln.runtime import cache
    cache.commit_entry(header + ".gch")
    cpp_pch.reset()
    kiln.reset()
    _compile_and_check(4.5)
    assert "failed to build with the precompiled prelude" in capsys.readouterr().err
    kiln.reset()
    _compile_and_check(5.5)  # given up for the process: plain builds, still correct


def test_switched_off(fresh_cache, monkeypatch):
    monkeypatch.setattr(kiln.config, "cpp_pch", False)
    _compile_and_check(1.5)
    assert cpp_pch.wait_ready(timeout=0.5) is None
    assert not glob.glob(str(fresh_cache / "pch" / "*" / "*.gch"))
