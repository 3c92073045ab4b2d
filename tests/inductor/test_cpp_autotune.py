"""C++ chunk-size autotuning (KILN_AUTOTUNE=1 only: codegen/cpp_tune.py, runtime/autotune.py
CppAutotuned): large kernels take the OpenMP chunk as an argument, are timed on their first
call, and the choice is cached on disk; every choice gives the bits of the untuned kernel."""
import glob
import hashlib
import os
import subprocess
import sys

import pytest
import torch

import kiln
from kiln.runtime import autotune
from tests.testing import config_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POINTWISE = lambda x: torch.relu(x) * 2 + 1  # noqa: E731
SOFTMAX = lambda x: torch.softmax(x, -1)  # noqa: E731
COLUMN = lambda x: x.sum(0)  # noqa: E731
# sha256 prefixes of these kernels' sources (less the "// from:" origin lines) generated before chunk tuning existed (x: [512, 256]); softmax regenerated in session 16 (a row division became a reciprocal multiply) and in session 19 (the reciprocal is computed once before the row loop)
# re-pinned in session 21: kiln_max without a short-circuit (so gcc vectorizes ReLU and max loops);
# in session 24: the prelude includes <limits> and <type_traits> (integer division helpers);
# in session 38: softmax's and column's fp32 sums flush into double partials (cascaded sums);
# in session 39: softmax's 256-wide rows fit one float chain, so no double partials (its
# lanes still combine in double)
GOLDEN = {"pointwise": "aefa083ea36d8979", "softmax": "a3740101617b4b67", "column": "bd4d6f745799042e"}


def _x():
    return torch.randn(512, 256, generator=torch.Generator().manual_seed(0))


def _explain(fn, x, tune, cache_dir):
    with kiln.config.patch(cpu_backend="cpp", triton_autotune=tune, cache_dir=str(cache_dir)):
        return kiln.explain(fn, dynamic=False)(x)


def _entries(cache_dir):
    return glob.glob(os.path.join(str(cache_dir), "**", "autotune", "**", "*.json"), recursive=True)


def test_switch_off_generates_the_untuned_source(tmp_path):
    for name, fn in (("pointwise", POINTWISE), ("softmax", SOFTMAX), ("column", COLUMN)):
        (k,) = _explain(fn, _x(), False, tmp_path).kernels
        assert k.tune is None and "kiln_chunk" not in k.source and "omp.h" not in k.source
        code = "\n".join(ln for ln in k.source.split("\n") if not ln.startswith("// from:"))
        assert hashlib.sha256(code.encode()).hexdigest()[:16] == GOLDEN[name], name
    assert not _entries(tmp_path)


@pytest.mark.parametrize("name,fn", [("pointwise", POINTWISE), ("softmax", SOFTMAX), ("column", COLUMN)])
def test_tuned_kernel_matches_untuned_bits_and_caches_its_choice(tmp_path, name, fn):
    x = _x()
    plain = _explain(fn, x, False, tmp_path).result
    before = dict(autotune.cpp_stats)
    out = _explain(fn, x, True, tmp_path)
    (k,) = out.kernels
    assert k.tune is not None and "schedule(static, kiln_c) if(kiln_chunk >= 0)" in k.source
    assert k.tune["cpp_chunks"][:2] == [-1, 0] and len(k.tune["cpp_chunks"]) >= 3
    assert torch.equal(out.result, plain), name  # only the partition of rows changed
    torch.testing.assert_close(out.result, fn(x), rtol=1e-5, atol=1e-4)  # a 512-term column sum
    assert autotune.cpp_stats["tuned"] == before["tuned"] + 1
    (entry,) = _entries(tmp_path)
    assert int(open(entry).read()) in k.tune["cpp_chunks"]
    # after reset (memory caches cleared) a new compile reads the choice from disk
    kiln.reset()
    again = _explain(fn, x, True, tmp_path)
    assert torch.equal(again.result, plain)
    assert autotune.cpp_stats["tuned"] == before["tuned"] + 1
    assert autotune.cpp_stats["disk_hits"] == before["disk_hits"] + 1
    assert len(_entries(tmp_path)) == 1


def test_every_chunk_choice_gives_the_same_bits(tmp_path):
    x = _x()
    fn = SOFTMAX
    (k,) = _explain(fn, x, True, tmp_path).kernels
    from kiln.runtime.cpp_build import load_cpp_function
    f = load_cpp_function(k.source, k.name, len(k.args), 1)
    results = []
    for chunk in k.tune["cpp_chunks"]:
        out = torch.full_like(x, float("nan"))
        f(x.data_ptr(), out.data_ptr(), chunk)
        results.append(out)
    for r in results:
        assert torch.equal(r, results[0])
    torch.testing.assert_close(results[0], fn(x))


def test_small_kernels_are_not_tuned(tmp_path):
    (k,) = _explain(POINTWISE, torch.randn(64, 64), True, tmp_path).kernels
    assert k.tune is None and "kiln_chunk" not in k.source


def test_a_new_process_reads_the_cached_choice(tmp_path):
    script = ("import torch, kiln; x = torch.randn(512, 256); "
              "f = kiln.compile(lambda x: torch.relu(x) * 2 + 1); "
              "assert torch.equal(f(x), torch.relu(x) * 2 + 1)")
    env = config_env(dict(os.environ, KILN_AUTOTUNE="1", KILN_CACHE_DIR=str(tmp_path), KILN_LOGS="autotune",
                          PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])), graph_cache=False)
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert "chose chunk" in first.stderr and "from the cache" not in first.stderr
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
    assert second.returncode == 0, second.stderr
    assert "from the cache" in second.stderr and "chose chunk" not in second.stderr
