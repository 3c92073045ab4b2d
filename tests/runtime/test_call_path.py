"""The call path: Triton kernels launched through their compiled launcher (checked against a
stand-in kernel, since the real launcher needs a GPU); compile time broken down by stage,
the lazily compiled backward included."""
import torch

import kiln
from kiln import api, context
from kiln.observe.explain import summarize
from kiln.runtime.launch import FastLauncher


class _Kernel:
    """A stand-in for Triton's CompiledKernel: records the launcher calls."""

    def __init__(self, log):
        self.log = log
        self.function, self.packed_metadata = "fn", "meta"

    def run(self, *args):
        self.log.append(("fast", args))


class _Jit:
    arg_names = ["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"]

    def __init__(self):
        self.log = []
        self.kernel = _Kernel(self.log)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return self.kernel
        return launch


class _Ptr:
    def __init__(self, p):
        self.p = p

    def data_ptr(self):
        return self.p


def _launcher(jit, device=None):
    dev = [0]
    return FastLauncher(jit, "k", get_device=lambda: dev[0], get_stream=lambda d: 77,
                        hooks=lambda: (None, None)), dev


def test_fast_launch_after_the_first_jit_launch():
    jit = _Jit()
    lau, _ = _launcher(jit)
    a, b = _Ptr(1024), _Ptr(2048)
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    assert [e[0] for e in jit.log] == ["jit", "fast"]
    # the JIT's own launcher argument list: grid, stream, function, metadata, hooks, args, constexprs
    assert jit.log[1][1] == (4, 1, 1, 77, "fn", "meta", None, None, None, a, b, 4096, 1024)


def test_specialization_changes_take_the_jit_path():
    jit = _Jit()
    lau, dev = _launcher(jit)
    a, b = _Ptr(1024), _Ptr(2048)
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    lau[(4,)](_Ptr(1028), b, 4096, XBLOCK=1024, num_warps=4)    # unaligned pointer
    lau[(4,)](a, b, 4095, XBLOCK=1024, num_warps=4)             # not divisible by 16
    lau[(4,)](a, b, 1, XBLOCK=1024, num_warps=4)                # the value 1
    lau[(4,)](a, b, 2 ** 33, XBLOCK=1024, num_warps=4)          # past 32 bits
    lau[(4,)](a, b, 4096, XBLOCK=512, num_warps=4)              # other constexprs
    dev[0] = 1
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)             # another device
    dev[0] = 0
    lau[(4,)](a, b, 8192, XBLOCK=1024, num_warps=4)             # same class: fast
    assert [e[0] for e in jit.log] == ["jit"] * 7 + ["fast"]
    lau[(8,)](a, b, 8192, XBLOCK=1024, num_warps=4)             # a new grid binds on its own
    assert jit.log[-1][0] == "jit"


def test_unaligned_first_launch_stays_correct_for_any_pointer():
    jit = _Jit()
    lau, _ = _launcher(jit)
    lau[(1,)](_Ptr(1028), _Ptr(2048), 64, XBLOCK=64, num_warps=1)
    lau[(1,)](_Ptr(1024), _Ptr(2048), 64, XBLOCK=64, num_warps=1)  # an unspecialized kernel runs any pointer
    assert [e[0] for e in jit.log] == ["jit", "fast"]


def test_compile_times_by_stage_include_the_lazy_backward():
    w = torch.randn(8, 4, requires_grad=True)

    def f(x):
        return torch.tanh(x @ w).sum(0) * 3

    recorder = []
    api._RECORDERS.append(recorder)
    try:
        x = torch.randn(5, 8)
        out = kiln.compile(f)(x)
        out.sum().backward()
    finally:
        api._RECORDERS.remove(recorder)
    torch.testing.assert_close(w.grad, x.t() @ (3 * (1 - torch.tanh(x @ w) ** 2)))
    names = [c.name for c in recorder]
    assert any(n.endswith("_backward") for n in names), names
    summary = summarize(recorder)
    for stage in context.STAGES:
        assert summary.compile_times.get(stage, 0) > 0, (stage, summary.compile_times)
    backward = next(c for c in recorder if c.name.endswith("_backward"))
    assert backward.stage_times["build"] > 0 and backward.stage_times["codegen"] > 0
