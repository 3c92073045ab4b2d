"""The call path: Triton kernels launched through their compiled launcher (checked against a
stand-in kernel, since the real launcher needs a GPU); compile time broken down by stage,
the lazily compiled backward included."""
import pytest
import torch

import kiln
from kiln import api, context
from kiln.observe.explain import summarize
from kiln.runtime.launch import FastLauncher
from testing import assert_close


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
                        hooks=lambda: ()), dev


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


def test_a_launch_line_fixes_grid_and_constexprs_once():
    from kiln.runtime.launch import LaunchLine, line_of
    jit = _Jit()
    lau, dev = _launcher(jit)
    line = line_of(lau, (4,), XBLOCK=1024, num_warps=4)
    assert isinstance(line, LaunchLine)
    a, b = _Ptr(1024), _Ptr(2048)
    line(a, b, 4096)
    line(a, b, 4096)
    assert [e[0] for e in jit.log] == ["jit", "fast"]
    assert jit.log[0][2:] == ((a, b, 4096), {"XBLOCK": 1024, "num_warps": 4})
    # addresses go to the launcher as integers (config.triton_pointer_ints)
    assert jit.log[1][1] == (4, 1, 1, 77, "fn", "meta", None, None, None, 1024, 2048, 4096, 1024)
    line(_Ptr(1028), b, 4096)   # unaligned: the JIT (or a record) decides
    line(a, b, 4095)            # another integer class
    dev[0] = 1
    line(a, b, 4096)            # another device
    dev[0] = 0
    line(a, b, 8192)            # same class: fast
    assert [e[0] for e in jit.log] == ["jit", "fast", "jit", "jit", "jit", "fast"]


def test_a_launch_line_can_pass_tensors_themselves(monkeypatch):
    from kiln.runtime.launch import line_of
    monkeypatch.setattr(kiln.config, "triton_pointer_ints", False)
    jit = _Jit()
    lau, _ = _launcher(jit)
    line = line_of(lau, (4,), XBLOCK=1024, num_warps=4)
    a, b = _Ptr(1024), _Ptr(2052)  # b unaligned at bind: never checked
    line(a, b, 4096)
    line(a, _Ptr(2048), 4096)
    line(_Ptr(1028), b, 4096)
    assert [e[0] for e in jit.log] == ["jit", "fast", "jit"]
    assert jit.log[1][1][9:11] == (a, jit.log[1][1][10]) and isinstance(jit.log[1][1][10], _Ptr)


def test_a_launch_line_over_a_plain_jit_function_passes_everything():
    from kiln.runtime.launch import line_of
    jit = _Jit()
    line = line_of(jit, (2, 3), XBLOCK=64, num_warps=2)
    line(_Ptr(1024), 7)
    assert jit.log == [("jit", (2, 3), (jit.log[0][2][0], 7), {"XBLOCK": 64, "num_warps": 2})]


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


class _Chain:
    """Triton 3.5+'s HookChain: a knob that is always set, with a list of registered calls."""

    def __init__(self, calls):
        self.calls = calls


def test_an_empty_hook_chain_is_no_hook():
    from kiln.runtime.launch import _hook_set
    assert not _hook_set(None) and not _hook_set(_Chain([]))
    assert _hook_set(_Chain([print])) and _hook_set(print)
    jit = _Jit()
    lau = FastLauncher(jit, "k", get_device=lambda: 0, get_stream=lambda d: 77, hooks=lambda: (print,))
    a, b = _Ptr(1024), _Ptr(2048)
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    assert [e[0] for e in jit.log] == ["jit", "jit"]  # a registered hook (a profiler) sees every launch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the real launcher needs a GPU")
def test_cuda_kernels_launch_through_the_compiled_launcher(monkeypatch):
    from kiln.runtime import launch
    slow = []
    original = launch.FastLauncher.slow
    monkeypatch.setattr(launch.FastLauncher, "slow",
                        lambda self, *a: slow.append(self.name) or original(self, *a))
    f = kiln.compile(lambda x, y: torch.relu(x) * y - x.sum(1, keepdim=True))
    for _ in range(4):
        x, y = torch.randn(64, 96, device="cuda"), torch.randn(64, 96, device="cuda")
        torch.testing.assert_close(f(x, y), torch.relu(x) * y - x.sum(1, keepdim=True))
    assert slow and len(slow) == len(set(slow)), slow  # each kernel's first launch only


def test_the_remembered_code_cache_follows_kiln_reset():
    """The call path keeps its CodeCache on the CompiledFunction (no hash of the cache key per
    call); kiln.reset() must still start it afresh."""
    f = kiln.compile(lambda x: torch.relu(x) * 3)
    x = torch.randn(5, 3).t()  # non-contiguous
    assert_close(f(x), torch.relu(x) * 3)
    first = f.cache
    assert f.cache is first and first.entries
    kiln.reset()
    assert_close(f(x), torch.relu(x) * 3)
    assert f.cache is not first and kiln.stats()["frames_compiled"] == 1


class _KnownLauncher:
    """A launcher of the shape launch._direct recognizes by the digest of its __call__."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = 0, 1

    def __init__(self, log):
        self.log = log
        self.launch = lambda *a: log.append(("direct", a))

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.log.append(("call", (gridX, gridY, gridZ, stream, function) + args))


class _DirectKernel(_Kernel):
    def __init__(self, log, launcher):
        super().__init__(log)
        self.run = launcher


class _DirectJit(_Jit):
    def __init__(self, scratch=0):
        super().__init__()
        launcher = _KnownLauncher(self.log)
        launcher.global_scratch_size = scratch
        self.kernel = _DirectKernel(self.log, launcher)


@pytest.fixture
def known_launcher(monkeypatch):
    from kiln.runtime import launch
    monkeypatch.setattr(launch, "KNOWN_LAUNCHERS", {launch._call_digest(_KnownLauncher)})
    monkeypatch.setattr(launch, "_direct_by_class", {})


def test_a_known_launcher_is_entered_at_its_c_function(known_launcher):
    from kiln.runtime.launch import line_of
    jit = _DirectJit()
    lau, _ = _launcher(jit)
    line = line_of(lau, (4,), XBLOCK=1024, num_warps=4)
    a, b = _Ptr(1024), _Ptr(2048)
    line(a, b, 4096)
    line(a, b, 4096)
    lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    assert [e[0] for e in jit.log] == ["jit", "direct", "direct"]
    # what the launcher's __call__ passes on: cooperative, pdl, no scratch, then its own arguments
    assert jit.log[1][1] == (4, 1, 1, 77, "fn", 0, 1, None, None, "meta", None, None, None, 1024, 2048, 4096, 1024)
    assert jit.log[2][1] == (4, 1, 1, 77, "fn", 0, 1, None, None, "meta", None, None, None, a, b, 4096, 1024)


def test_a_launcher_that_needs_scratch_or_is_unknown_keeps_its_call(known_launcher, monkeypatch):
    from kiln.runtime import launch
    jit = _DirectJit(scratch=128)
    lau, _ = _launcher(jit)
    a, b = _Ptr(1024), _Ptr(2048)
    for _ in range(2):
        lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    assert [e[0] for e in jit.log] == ["jit", "call"]
    monkeypatch.setattr(launch, "KNOWN_LAUNCHERS", set())
    monkeypatch.setattr(launch, "_direct_by_class", {})
    jit = _DirectJit()
    lau, _ = _launcher(jit)
    for _ in range(2):
        lau[(4,)](a, b, 4096, XBLOCK=1024, num_warps=4)
    assert [e[0] for e in jit.log] == ["jit", "call"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_installed_triton_launcher_is_recognized_where_known():
    """On the H200 (Triton 3.6) the launcher's __call__ is the known one; a compiled kernel's
    launches then enter its C function (and give eager's answers)."""
    import triton
    from kiln.runtime import launch
    if not triton.__version__.startswith("3.6"):
        pytest.skip(f"digest recorded for Triton 3.6 only (this is {triton.__version__})")
    seen = []
    original = launch._direct
    launch._direct = lambda run: seen.append(original(run)) or seen[-1]
    try:
        f = kiln.compile(lambda x, y: torch.relu(x) * y + 1)
        for _ in range(3):
            x, y = torch.randn(64, 96, device="cuda"), torch.randn(64, 96, device="cuda")
            assert_close(f(x, y), torch.relu(x) * y + 1)
    finally:
        launch._direct = original
    assert seen and all(d is not None for d in seen), seen
