"""The loop IR printed as Python (inductor/loop_python.py) runs, and computes what the generated
kernels compute: each program below is compiled, its generated wrapper and kernels are run, and
the Python printout of the same schedule is run on the same inputs (the ones the compiled graph
was called with), for every kernel kind: pointwise, reduction (split too), scatter, indirect
loads; float32 and integer dtypes; non-contiguous inputs."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import api, pipeline
from kiln.inductor import ir
from kiln.inductor.loop_python_program import build_python, program_python
from kiln.inductor.scheduler import Kernel, ScatterStep
from testing import TARGETS, assert_close, on_target, randn


def _compile_and_record(fn, args, monkeypatch, dynamic=None):
    """(schedule, generated call, its arguments) of the last graph that compiling fn made."""
    seen, contexts = [], []
    build = pipeline.build

    def recording_build(*a, **k):
        call = build(*a, **k)

        def run(*xs):
            seen.append((call, xs))
            return call(*xs)
        return run
    monkeypatch.setattr(pipeline, "build", recording_build)
    api._RECORDERS.append(contexts)
    try:
        out = kiln.compile(fn, dynamic=dynamic)(*args)
    finally:
        api._RECORDERS.remove(contexts)
    assert_close(out, fn(*args))
    return contexts[-1].artifact("schedule"), *seen[-1]


def _check_against_generated(fn, args, monkeypatch, kinds, dynamic=None):
    sched, generated, inputs = _compile_and_record(fn, args, monkeypatch, dynamic)
    assert {_kind(k) for k in sched.kernels} >= set(kinds), str(sched)
    expected = generated(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    actual = build_python(sched)(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        assert_close(a, e)
    return sched


def _kind(step) -> str:
    if isinstance(step, ScatterStep):
        return "scatter"
    indirect = any(isinstance(e, ir.Let) for n in step.nodes for e in ir.walk(n.body))
    if indirect:
        return "indirect"
    return "reduction" if step.is_reduction else "pointwise"


CASES = {
    "pointwise_f32_transposed": (lambda x, y: torch.sigmoid(x) * y + 1,
                                 lambda dev: (randn((6, 10), torch.float32, dev, "transposed"),
                                              randn((6, 10), torch.float32, dev)), ["pointwise"]),
    "pointwise_int32": (lambda a, b: torch.where(a > 0, a * 3, b // 4) + (a & 6),
                        lambda dev: (randn((5, 7), torch.int32, dev), randn((5, 7), torch.int32, dev)),
                        ["pointwise"]),
    "softmax_f32": (lambda x: torch.softmax(x, -1) * 2, lambda dev: (randn((6, 40), torch.float32, dev),),
                    ["reduction"]),
    "layer_norm_f32_transposed": (lambda x, w: F.layer_norm(x, (12,), w),
                                  lambda dev: (randn((9, 12), torch.float32, dev, "transposed"),
                                               randn((12,), torch.float32, dev)), ["reduction"]),
    "reduction_int32_argmax": (lambda x: (x.t() * 3).sum(0) + x.argmax(1),
                               lambda dev: (randn((8, 6), torch.int32, dev, "transposed"),), ["reduction"]),
    "split_sum_f32": (lambda x: x.sum(-1) + x.amax(-1),
                      lambda dev: (randn((2, 8192), torch.float32, dev),), ["reduction"]),
    "scatter_f32": (lambda x, i, v: x.index_add(0, i, v),
                    lambda dev: (randn((6, 8), torch.float32, dev), torch.randint(0, 6, (9,), device=dev),
                                 randn((9, 8), torch.float32, dev)), ["scatter"]),
    "scatter_int64": (lambda x, i, v: x.scatter_add(1, i, v),
                      lambda dev: (randn((4, 5), torch.int64, dev), torch.randint(0, 5, (4, 7), device=dev),
                                   randn((4, 7), torch.int64, dev)), ["scatter"]),
    "embedding_f32": (lambda w, i: F.embedding(i, w) * 2,
                      lambda dev: (randn((10, 8), torch.float32, dev), torch.randint(0, 10, (3, 4), device=dev)),
                      ["indirect"]),
    "gather_int32_transposed": (lambda x, i: torch.gather(x, 1, i) + 1,
                                lambda dev: (randn((7, 5), torch.int32, dev, "transposed"),
                                             torch.randint(0, 5, (5, 3), device=dev)), ["indirect"]),
    "negative_index_f32": (lambda x, i: x[i] - 1,
                           lambda dev: (randn((6, 4), torch.float32, dev), torch.randint(-6, 6, (5,), device=dev)),
                           ["indirect"]),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_printout_computes_what_the_generated_kernels_compute(case, target, monkeypatch):
    fn, make, kinds = CASES[case]
    with on_target(target) as device, torch.no_grad():
        _check_against_generated(fn, make(device), monkeypatch, kinds)


def test_cat_and_pad_read_their_other_source_only_where_selected(monkeypatch):
    """A cat's where reads addresses outside a source for lanes it does not select: the
    printout reads them clamped (the kernels mask them) and the where discards them."""
    fn = lambda a, b: F.pad(torch.cat([a, b], 1), (2, 3)) * 2  # noqa: E731
    _check_against_generated(fn, (torch.randn(4, 3), torch.randn(4, 5)), monkeypatch, ["pointwise"])


def test_library_call_and_epilogue(monkeypatch):
    fn = lambda x, w, b: torch.relu(F.linear(x, w) + b)  # noqa: E731
    with torch.no_grad():
        sched = _check_against_generated(fn, (torch.randn(5, 8), torch.randn(6, 8), torch.randn(6)),
                                         monkeypatch, ["pointwise"])
    source = program_python(sched)
    # the library call itself: extern_<op>(...), or the op's own direct call (a Linear's
    # weight, read transposed by mm, is torch's linear: op_mm._mm_wrapper_call)
    assert sched.externs and all(f"extern_{e.op.name}(" in source or "torch.nn.functional.linear(" in source
                                 for e in sched.externs), source


def test_symbolic_sizes_are_arguments(monkeypatch):
    fn = lambda x: torch.softmax(x, -1) + 1  # noqa: E731
    sched = _check_against_generated(fn, (torch.randn(5, 7),), monkeypatch, ["reduction"], dynamic=True)
    source = sched.kernels[0].python()
    assert "def kernel0(arg0, buf" in source and ", s0" in source, source


def test_kernel_python_runs_on_its_own(monkeypatch):
    """``Kernel.python()`` is a module: exec'd in empty globals, its function fills the store."""
    x = torch.randn(4, 6)
    sched, _, _ = _compile_and_record(lambda x: (x * 2).exp(), (x,), monkeypatch)
    kernel = sched.kernels[0]
    assert isinstance(kernel, Kernel)
    source = kernel.python()
    ns: dict = {}
    exec(compile(source, "<kernel>", "exec"), ns)
    out = torch.empty(4, 6)
    ns[kernel.name](x, out)
    assert_close(out, (x * 2).exp())
    assert "prims.mul(" in source and "prims.exp(" in source


def test_out_of_range_index_raises_like_the_generated_kernel(monkeypatch):
    w, i = torch.randn(10, 8), torch.tensor([1, 2, 3])
    sched, generated, inputs = _compile_and_record(lambda w, i: F.embedding(i, w), (w, i), monkeypatch)
    bad = [torch.tensor([1, 12, 3]) if x.dtype == torch.int64 else x for x in inputs]
    with pytest.raises(IndexError):
        generated(*bad)
    with pytest.raises(IndexError):
        build_python(sched)(*bad)
