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
