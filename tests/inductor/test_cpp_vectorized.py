"""gcc vectorizes the row loops kiln writes: every ``#pragma omp simd`` loop of a batch norm +
ReLU training forward (whose output pass also stores the ReLU's bool mask) and of a softmax
(whose first pass is a max) is reported vectorized by gcc's own ``-fopt-info-vec``. Before
session 21, ``kiln_max``'s short-circuit ``||`` (control flow) and stores through ``bool*``
("complicated access pattern") left those loops scalar."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.config import config

pytestmark = pytest.mark.skipif(shutil.which(config.cpp_compiler) is None, reason="no C++ compiler")


def _vectorized_lines(source: str, tmp_path) -> tuple[set, list]:
    path = os.path.join(tmp_path, "k.cpp")
    with open(path, "w") as f:
        f.write(source)
    flags = [f for f in config.cpp_flags if f not in ("-shared",)]
    proc = subprocess.run([config.cpp_compiler, *flags, "-c", "-fopt-info-vec-optimized", path,
                           "-o", os.path.join(tmp_path, "k.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = {int(m.group(1)) for m in re.finditer(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    lines = source.split("\n")
    simd = [i + 1 for i, ln in enumerate(lines) if ln.strip() == "#pragma omp simd"]  # 1-based
    return done, simd


def _all_vectorized(done, simd) -> bool:
    """Each simd pragma's loop is reported vectorized (gcc names a line of the loop: its header
    or a statement of its body, before the next pragma)."""
    ends = simd[1:] + [10 ** 9]
    return bool(simd) and all(any(p < line < end for line in done) for p, end in zip(simd, ends))


def _sources(fn, *args):
    with kiln.config.patch(strict=True, cpu_backend="cpp"):
        r = kiln.explain(fn)(*args)
    return [k.source for k in r.kernels]


def test_batch_norm_relu_training_loops_vectorize(tmp_path):
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)

    def fn(x):
        return F.relu(F.batch_norm(x, None, None, w, b, training=True))
    sources = _sources(fn, x)
    main = [s for s in sources if "acc0" in s]
    assert main and any("uint8_t* __restrict__" in s for s in main)  # the ReLU's mask, as bytes
    for source in main:
        done, simd = _vectorized_lines(source, tmp_path)
        assert _all_vectorized(done, simd), (sorted(done), simd)


def test_softmax_max_pass_vectorizes(tmp_path):
    x = torch.randn(64, 256)
    (source,) = _sources(lambda x: torch.softmax(x, -1), x)
    assert "kiln_max" in source
    done, simd = _vectorized_lines(source, tmp_path)
    assert _all_vectorized(done, simd), (sorted(done), simd)
