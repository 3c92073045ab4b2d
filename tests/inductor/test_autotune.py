"""Autotuning (kiln/runtime/autotune.py): on CUDA, Triton kernels launch through an
``Autotuned`` that times a few configs on the first call and caches the winner on disk.
Here the Triton interpreter stands in (config.triton_autotune = "interpret")."""
import glob
import json
import os

import pytest
import torch

import kiln
from testing import INTERPRET, assert_close

pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs the Triton interpreter")


def _tuned(fn, *args, tmp_path):
    with kiln.config.patch(cpu_backend="triton", triton_autotune="interpret", cache_dir=str(tmp_path)):
        return kiln.explain(fn)(*args)


def test_pointwise_kernel_is_tuned_and_cached(tmp_path):
    fn = lambda x: torch.relu(x) * 2 + 1  # noqa: E731
    x = torch.randn(256, 256)
    out = _tuned(fn, x, tmp_path=tmp_path)
    assert ".run(" in str(out.wrappers[0])
    assert_close(out.result, fn(x))
    entries = glob.glob(os.path.join(str(tmp_path), "**", "autotune", "**", "*.json"), recursive=True)
    assert len(entries) == 1
    variant, cfg = json.load(open(entries[0]))
    assert variant == 0 and cfg["XBLOCK"] in (256, 512, 1024, 2048, 4096)
    # a second compile finds the choice on disk (no new entry) and gives the same values
    again = _tuned(fn, x, tmp_path=tmp_path)
    assert_close(again.result, fn(x))
    assert len(glob.glob(os.path.join(str(tmp_path), "**", "autotune", "**", "*.json"), recursive=True)) == 1


def test_reduction_tunes_persistent_and_looped_variants(tmp_path):
    fn = lambda x: torch.softmax(x, -1)  # noqa: E731
    x = torch.randn(64, 1024)
    out = _tuned(fn, x, tmp_path=tmp_path)
    assert_close(out.result, fn(x))
    (k,) = out.kernels
    assert k.tune is not None and len(k.tune.variants) == 2  # persistent and looped sources
    assert "for roffset" not in k.tune.variants[0][0] and "for roffset" in k.tune.variants[1][0]
    assert all(c["RBLOCK"] == 1024 for c in k.tune.variants[0][1])


def test_small_kernels_and_default_interpreter_keep_the_heuristic(tmp_path):
    x = torch.randn(8, 8)
    out = _tuned(lambda x: x * 2, x, tmp_path=tmp_path)
    assert ".run(" not in str(out.wrappers[0])
    with kiln.config.patch(cpu_backend="triton"):
        out = kiln.explain(lambda x: x * 2)(torch.randn(256, 256))
    assert ".run(" not in str(out.wrappers[0]) and "XBLOCK=" in str(out.wrappers[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_column_reduction_tunes_wide_column_tiles(tmp_path, dtype):
    """A bias-gradient-style sum over rows tunes over [XBLOCK kept, RBLOCK reduced] tiles with
    many kept elements per program; a row reduction's one-row configs would read a sector per
    element. The split's first stage (column chunks) and second stage both qualify."""
    fn = lambda g: g.sum(0)  # noqa: E731
    g = torch.randn(2048, 96, dtype=dtype)[:, :80]  # non-contiguous rows
    with kiln.config.patch(split_column_reductions="always"):
        out = _tuned(fn, g, tmp_path=tmp_path)
    torch.testing.assert_close(out.result.float(), fn(g).float(), rtol=2e-2 if dtype != torch.float32 else 1e-4,
                               atol=1e-1 if dtype != torch.float32 else 1e-3)
    tuned = [k for k in out.kernels if k.tune is not None]
    assert tuned, [k.name for k in out.kernels]
    for k in tuned:
        cfgs = [c for _, cs in k.tune.variants for c in cs]
        assert cfgs and all(c["XBLOCK"] >= 16 for c in cfgs), cfgs


def test_identical_tuned_kernels_tune_once(tmp_path):
    """Two kernels equal up to their names (a layer repeated) share one tuner: one autotune
    entry, one set of compiled configs, and both give eager's values."""
    def fn(x, w):
        a = torch.relu(x) * 2 + 1
        return torch.relu(a @ w) * 2 + 1  # the matmul keeps the two pointwise kernels apart
    x, w = torch.randn(256, 256), torch.randn(256, 256) / 16
    out = _tuned(fn, x, w, tmp_path=tmp_path)
    assert_close(out.result, fn(x, w))
    tuned = [k for k in out.kernels if k.tune is not None]
    assert len(tuned) == 2
    entries = glob.glob(os.path.join(str(tmp_path), "**", "autotune", "**", "*.json"), recursive=True)
    assert len(entries) == 1
