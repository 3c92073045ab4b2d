"""Gradients for every op-table entry marked differentiable: kiln's forward outputs and input
gradients (backends aot_eager and kiln on C++, strict mode) match eager autograd on the entry's
first non-empty float32 sample and its first sample holding an empty tensor (backward builds are
the slow part, so no more)."""
import pytest
import torch

import kiln
from optable import ENTRIES
from optable.runner import batched, check, make_samples, marks_for

GRAD = [e for e in ENTRIES if e.differentiable]


def _params():
    out = []
    for entry in GRAD:
        for backend in ("aot_eager", "kiln"):
            strict, _ = marks_for(entry, f"grad_{backend}")
            marks = [pytest.mark.xfail(reason=strict, strict=True)] if strict else []
            out.append(pytest.param(entry, backend, marks=marks, id=f"{entry.name}-{backend}"))
    return out


def _leaf(a):
    """A float sample as a leaf, its special values (NaN, inf, 0: kinks) replaced by values in
    (0.3, 0.9), inside every entry's domain."""
    a = a.detach().clone()
    bad = ~torch.isfinite(a) | (a == 0)
    a[bad] = (torch.rand(int(bad.sum())) * 0.6 + 0.3).to(a.dtype)
    return a.requires_grad_()


def _leaves(args, nograd):
    return tuple(_leaf(a) if isinstance(a, torch.Tensor) and a.is_floating_point() and i not in nograd
                 else a for i, a in enumerate(args))


@pytest.mark.parametrize("entry,backend", _params())
def test_grad_matches_eager(entry, backend):
    samples = [(dt, _leaves(args, entry.nograd)) for dt, args in make_samples(entry, torch.device("cpu"), entry.grad_dtypes)]
    # the first non-empty sample (builds are slow) and the first sample with an empty tensor
    full = [s for s in samples if all(a.numel() for a in s[1] if isinstance(a, torch.Tensor))][:1]
    empty = [s for s in samples if not all(a.numel() for a in s[1] if isinstance(a, torch.Tensor))][:1]
    samples = full + empty
    run_all, flat = batched(entry.fn, [args for _, args in samples])
    leaves = [a for a in flat if isinstance(a, torch.Tensor) and a.requires_grad]
    expected = run_all(*flat)
    with kiln.config.patch(strict=True):
        actual = kiln.compile(run_all, backend=backend, fullgraph=True)(*flat)
    assert kiln.stats()["graph_breaks"] == 0
    outs_e = [t for t in _tensors(expected) if t.requires_grad]
    outs_a = [t for t in _tensors(actual) if t.requires_grad]
    assert len(outs_a) == len(outs_e) and outs_e, "no differentiable output"
    for (dt, args), a, e in zip(samples, actual, expected):
        check(a, e, dt, entry.tol, f"{entry.name} forward")
    tangents = [torch.randn_like(e) for e in outs_e]
    want = torch.autograd.grad(outs_e, leaves, tangents, allow_unused=True)
    with kiln.config.patch(strict=True):
        got = torch.autograd.grad(outs_a, leaves, tangents, allow_unused=True)
    for k, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
            continue
        assert g is not None, f"{entry.name}: input {k} got no gradient"
        check(g, w, torch.float32, entry.tol, f"{entry.name} grad of input {k}")


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    return []
