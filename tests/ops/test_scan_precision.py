"""Low-precision scans carry their running value in fp32 and round once, on every device.

Eager's CUDA scan kernels carry fp16/bf16 values in the half type: over a long scan the
product drifts (a 100k-element fp16 cumprod was off by 6.5 from the fp32 reference).
torch.compile's scans accumulate in fp32, and so must kiln's: the library call that does the
scan receives an fp32 tensor. Checked here structurally (the prims graph) and numerically
against the fp32 reference, with tolerances fit to each dtype.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.ops import core

LOW = [torch.float16, torch.bfloat16]
# one rounding of the result to the half type, relative to its magnitude
TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2), torch.float32: (1e-5, 1e-5)}


def _cumprod_input(n, dtype):
    """Values near 1 so that the product of n of them stays in range (as Inductor's own test:
    signs flip, magnitudes wander)."""
    x = 1 + 0.02 * torch.randn(n)
    x = torch.where(torch.rand(n) < 0.001, -x, x)
    return x.to(dtype)


def _prims_graph(op, x):
    from kiln.graph import Graph, Proxy
    from kiln.meta.tensor_meta import TensorMeta
    from kiln.ops.decompose import decompose
    g = Graph()
    p = Proxy(g.placeholder("x", TensorMeta.of(x)))
    g.output((op(p, 0),))
    return decompose(g)


def _library_scans(graph):
    return [n for n in graph.nodes if n.op == "call" and n.target.name in ("cumsum", "cumprod")
            and n.target.namespace == "prims"]


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_low_precision_scan_runs_in_fp32(op, dtype):
    x = _cumprod_input(4096, dtype)
    scans = _library_scans(_prims_graph(getattr(core, op), x))
    assert scans, "the scan stays a library call"
    assert all(n.args[0].meta["val"].dtype == torch.float32 for n in scans), \
        f"{op} of {dtype} is scanned in {[n.args[0].meta['val'].dtype for n in scans]}"
    fn = (lambda x: torch.cumsum(x, 0)) if op == "cumsum" else (lambda x: torch.cumprod(x, 0))
    assert kiln.explain(fn)(x).graph_break_count == 0
    assert "fallback" not in str(kiln.explain(fn)(x).graphs[0])


@pytest.mark.parametrize("dtype", LOW + [torch.float32], ids=str)
def test_split_cumprod_matches_the_fp32_reference(dtype):
    fn = lambda x: torch.cumprod(x.view(-1), 0)  # noqa: E731
    x = _cumprod_input(20000, dtype).view(2, 10000)
    got = kiln.compile(fn)(x)
    assert got.dtype == dtype
    ref = fn(x.float()).to(dtype)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_cumsum_rows_match_the_fp32_reference(dtype):
    fn = lambda x: torch.cumsum(x, 1) * 2  # noqa: E731
    x = torch.rand(3, 5000).to(dtype)
    got = kiln.compile(fn)(x)
    ref = fn(x.float()).to(dtype)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float64], ids=str)
def test_cumprod_dtypes_match_eager(dtype):
    fn = lambda x: torch.cumprod(x, 1)  # noqa: E731
    x = (torch.randint(-2, 3, (3, 7)) if dtype != torch.float64 else torch.randn(3, 7)).to(dtype)
    got = kiln.compile(fn, fullgraph=True)(x)
    ref = fn(x)
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got, ref)
    assert core.cumprod is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cumprod_grad_matches_eager_with_zeros(dtype):
    fn = lambda x: torch.cumprod(x, 1).sum() * 3  # noqa: E731
    x = torch.randn(3, 9).to(dtype)
    x[0, 2] = 0.0
    x[1, 4] = x[1, 7] = 0.0
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    fn(a).backward()
    kiln.compile(fn)(b).backward()
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(b.grad, a.grad, rtol=rtol * 2, atol=atol * 2)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0
