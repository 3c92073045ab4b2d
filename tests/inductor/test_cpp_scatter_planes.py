"""C++ scatter-add without atomics where outer slices cannot collide (codegen/scatter.py
``_plane_split``): a scatter along dim d writes each source element into the target slice of
its own coordinates before d, so one thread per slice needs no atomics. Results against eager
(with collisions inside slices), the structure in the generated source, and the cases that keep
atomics."""
from __future__ import annotations

import pytest
import torch

import kiln
from testing import assert_close


def _sources(fn, *args):
    with kiln.config.patch(strict=True):
        r = kiln.explain(fn)(*args)
    return r, [k.source[k.source.index('extern "C" void'):] for k in r.kernels if "+=" in k.source]


def _scatter_last(x, idx, src):
    return x.scatter_add(2, idx, src) * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_scatter_along_the_last_dim_runs_a_thread_per_slice(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 64, dtype=dtype)
    idx = torch.randint(0, 64, (4, 8, 512))      # eight adds per target element on average
    src = torch.randn(4, 8, 512, dtype=dtype)
    r, sources = _sources(_scatter_last, x, idx, src)
    assert_close(r.result, _scatter_last(x, idx, src), dtype)
    assert len(sources) == 1
    assert "omp atomic" not in sources[0] and "for (int64_t xp = 0; xp < 32; ++xp)" in sources[0]


def test_max_pool_gradient_scatter_has_no_atomics():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, 32, requires_grad=True)
    pool = torch.nn.MaxPool2d(3, 2, 1)
    cm = kiln.compile(pool)
    g = torch.randn(4, 16, 16, 16)
    r = kiln.explain(lambda t: cm(t).backward(g))(x)      # the first call: forward and backward compile
    got, x.grad = x.grad, None
    pool(x).backward(g)
    assert_close(got, x.grad)
    scatters = [k.source for k in r.kernels if "+=" in k.source]
    assert scatters and all("omp atomic" not in s and "xp < 64" in s for s in scatters)


@pytest.mark.parametrize("case", ["index_add_dim0", "few_slices"])
def test_scatters_that_may_collide_across_threads_keep_atomics(case):
    torch.manual_seed(0)
    if case == "index_add_dim0":  # the scattered dim is the outermost: no slice to split by
        x, idx, src = torch.randn(50, 64), torch.randint(0, 50, (4096,)), torch.randn(4096, 64)
        fn = lambda x, i, s: torch.index_add(x, 0, i, s) * 2  # noqa: E731
    else:  # fewer outer slices than PLANE_MIN
        x, idx, src = torch.randn(2, 64), torch.randint(0, 64, (2, 8192)), torch.randn(2, 8192)
        fn = lambda x, i, s: x.scatter_add(1, i, s) * 2  # noqa: E731
    r, sources = _sources(fn, x, idx, src)
    # threads add into a row in any order: about 80 (index_add) or 128 (scatter_add) fp32 terms
    # of size ~2 per element, so the sum's rounding differs from eager's sequential one by up to
    # ~n * eps * sum|terms| (1.6e-05 seen on 16 cores)
    torch.testing.assert_close(r.result, fn(x, idx, src), rtol=1e-5, atol=2e-4)
    assert len(sources) == 1 and "omp atomic" in sources[0] and "xp" not in sources[0]
