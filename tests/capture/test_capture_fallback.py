"""Fallback nodes: a torch callable with no core op runs eagerly inside the compiled graph when
its metadata can be computed on the meta device; otherwise a graph break with the op's name."""
import subprocess
import sys

import pytest
import torch

import kiln
from testing import assert_close


def f(x):
    y = torch.logcumsumexp(x * 2, dim=1)
    return torch.relu(y) + x.erfinv().nan_to_num()


def test_unknown_ops_become_fallback_nodes_inside_one_graph():
    x = torch.rand(4, 5)
    out = kiln.compile(f, fullgraph=True)(x)
    assert_close(out, f(x))
    e = kiln.explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0 and e.extern_calls == 2
    src = e.graphs[0].python()
    assert "core.fallback('torch.logcumsumexp', mul, dim=1)" in src and "'Tensor.erfinv'" in src


def test_fallback_printout_runs_in_a_fresh_process():
    e = kiln.explain(f)(torch.rand(3, 4))
    code = ("import torch\nfrom kiln.ops import core, prims\nfrom kiln.graph import graph\n"
            + e.graphs[0].python() + "\nx = torch.rand(3, 4)\nprint(f(x)[0].shape)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "torch.Size([3, 4])" in proc.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fallback_needing_a_gradient_compiles_with_torchs_gradient(dtype):
    """A fallback's VJP replays torch's autograd of the call in the backward (no break)."""
    x = torch.rand(4, 5, dtype=dtype).t().requires_grad_()  # non-contiguous
    fn = lambda x: torch.logcumsumexp(x, 0) * 2  # noqa: E731
    e = kiln.explain(fn)(x)
    assert e.graph_break_count == 0
    out = kiln.compile(fn, fullgraph=True)(x)
    g = torch.randn_like(out)
    got, = torch.autograd.grad(out, x, g)
    x_ref = x.detach().clone().requires_grad_()
    ref = fn(x_ref)
    want, = torch.autograd.grad(ref, x_ref, g)
    assert_close(out, ref)  # tolerances fit the dtype (tests/testing.py)
    assert out.stride() == ref.stride() and out.dtype == ref.dtype
    assert_close(got, want)


def test_fallback_with_a_keyword_tensor_needing_a_gradient_is_a_graph_break():
    x, w = torch.rand(2, 3), torch.rand(2, 2, requires_grad=True)
    fn = lambda x, w: torch.kron(x, other=w * 2)  # noqa: E731
    e = kiln.explain(fn)(x, w)
    assert e.graph_break_count == 1 and "by keyword" in e.break_reasons[0].reason
    out = kiln.compile(fn)(x, w)
    g = torch.randn_like(out)
    w_ref = w.detach().clone().requires_grad_()
    ref = fn(x, w_ref)
    assert_close(out, ref)
    assert_close(torch.autograd.grad(out, w, g)[0], torch.autograd.grad(ref, w_ref, g)[0])


def test_side_effects_and_data_dependent_shapes_stay_graph_breaks():
    # (x.uniform_() was here: in-place random fills are captured now, test_random_fill_inplace.py)
    for fn in (lambda x: torch.nonzero(x), lambda x: x.bernoulli_(), lambda x: x.cpu() + 1):
        e = kiln.explain(fn)(torch.rand(3))
        assert e.graph_break_count == 1
