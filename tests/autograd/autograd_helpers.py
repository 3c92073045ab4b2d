"""Helpers for the autograd tests: build a core-op graph from a function, compile it, and
compare forward outputs and input grads with eager autograd."""
from __future__ import annotations

import torch

import kiln
from kiln.graph import Graph, Proxy
from kiln.meta import TensorMeta
from kiln.pipeline import compile_graph
from testing import assert_close


def trace_core(fn, *inputs, name="fn") -> Graph:
    """Call fn (written with kiln.ops.core ops) on Proxies: a captured-like core graph."""
    g = Graph(name)
    proxies = [Proxy(g.placeholder(f"x{i}", TensorMeta.of(t))) if isinstance(t, torch.Tensor) else t
               for i, t in enumerate(inputs)]
    with g.building():  # ops without tensor arguments (rand) record into g
        out = fn(*proxies)
    g.output(tuple(out) if isinstance(out, (tuple, list)) else (out,))
    return g


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_grads(fn, inputs, backend, dtype=None):
    """Compile fn's core graph with `backend`, run forward + backward with a random tangent, and
    compare outputs and grads of every input requiring grad with eager autograd."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    leaves = [t for t in tensors if t.requires_grad]
    with kiln.config.patch(strict=True, verify=True):
        compiled = compile_graph(trace_core(fn, *inputs), backend)
        outs = as_tuple(compiled(*tensors))
    expected = as_tuple(fn(*inputs))
    assert len(outs) == len(expected)
    for o, e in zip(outs, expected):
        assert_close(o, e, dtype)
    diff = [(o, e) for o, e in zip(outs, expected) if e.requires_grad]
    tangents = [torch.randn_like(e) for _, e in diff]
    with kiln.config.patch(strict=True, verify=True):
        got = torch.autograd.grad([o for o, _ in diff], leaves, tangents, allow_unused=True)
    want = torch.autograd.grad([e for _, e in diff], leaves, tangents, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
            continue
        assert g is not None
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_close(g, w, dtype)
    return compiled
