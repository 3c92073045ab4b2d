"""torch.compiler's controls are honoured inside kiln (issue 27): disable, set_stance, reset,
is_compiling, assume_constant_result, mark_dynamic / mark_static and
cudagraph_mark_step_begin, each compared with eager and, where it is a count, with
torch.compile's own (a counting backend)."""
import itertools
import warnings

import pytest
import torch

import kiln


def _torch_frames(fn, calls, **kw):
    """How many frames torch.compile compiles for ``calls`` (a list of argument tuples)."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    cnt = CompileCounter()
    compiled = torch.compile(fn, backend=cnt, **kw)
    for args in calls:
        compiled(*args)
    torch._dynamo.reset()
    return cnt.frame_count


# ---------------------------------------------------------------- torch.compiler.disable

@torch.compiler.disable
def _native_cos(x):
    _native_cos.seen.append(torch.compiler.is_compiling())  # True only inside a trace
    return x.cos()


_native_cos.seen = []


def _calls_disabled(x):
    return _native_cos(x.sin()) + 1


def test_compiler_disable_is_one_break_and_runs_natively():
    x = torch.randn(3, 4)
    assert torch._dynamo.explain(_calls_disabled)(x).graph_break_count == 1
    _native_cos.seen.clear()
    out = kiln.explain(_calls_disabled)(x)
    assert out.graph_break_count == 1
    reason = out.break_reasons[0]
    assert "torch.compiler.disable" in reason.reason and "_native_cos" in reason.reason
    assert reason.source_line.strip() == "return _native_cos(x.sin()) + 1"
    assert _native_cos.seen == [False]  # called natively, not traced (a trace would see True)
    kiln.reset()
    compiled = kiln.compile(_calls_disabled)
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), _calls_disabled(x))
    assert kiln.stats()["graph_breaks"] == 1
    with pytest.raises(kiln.GraphBreakError, match="torch.compiler.disable"):
        kiln.compile(_calls_disabled, fullgraph=True)(x)


_disabled_cumsum = torch.compiler.disable(torch.cumsum)


def test_compiler_disable_on_a_torch_function_and_a_method():
    class M(torch.nn.Module):
        @torch.compiler.disable
        def helper(self, x):
            return x * 2

        def forward(self, x):
            return self.helper(x + 1) - _disabled_cumsum(x, 0)

    m = M()
    x = torch.randn(5)
    out = kiln.explain(m)(x)
    assert out.graph_break_count == 2
    assert all("torch.compiler.disable" in b.reason for b in out.break_reasons)
    torch.testing.assert_close(kiln.compile(m)(x), m(x))


def test_compiling_a_disabled_function_runs_it_natively():
    @kiln.disable
    def h(x):
        return x.sin()
    x = torch.randn(3)
    _native_cos.seen.clear()
    for fn in (_native_cos, h):
        torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
        assert kiln.stats()["frames_compiled"] == 0 and kiln.stats()["graph_breaks"] == 0
    assert _native_cos.seen == [False, False]  # not traced


# ---------------------------------------------------------------- torch.compiler.set_stance

def _f(x):
    return x.sin() * 2


def test_force_eager_compiles_nothing_and_default_compiles_again():
    cf = kiln.compile(_f, dynamic=False)
    x = torch.randn(4)
    with torch.compiler.set_stance("force_eager"):
        torch.testing.assert_close(cf(x), _f(x))
        assert kiln.stats()["frames_compiled"] == 0
        assert kiln.stats()["eager_runs"] == 0  # asked for: not an eager fallback
    torch.testing.assert_close(cf(x), _f(x))
    assert kiln.stats()["frames_compiled"] == 1
    torch.compiler.set_stance("force_eager")  # the plain-function form, as torch documents it
    try:
        cf(x)
        cf(torch.randn(7))
        assert kiln.stats()["frames_compiled"] == 1 and kiln.stats()["cache_hits"] == 0
    finally:
        torch.compiler.set_stance("default")
    cf(torch.randn(7))
    assert kiln.stats()["frames_compiled"] == 2


def test_force_eager_as_a_decorator_covers_compiled_modules():
    m = torch.nn.Linear(3, 2)
    cm = kiln.compile(m)

    @torch.compiler.set_stance("force_eager")
    def run(x):
        return cm(x)
    x = torch.randn(2, 3)
    torch.testing.assert_close(run(x), m(x))
    assert kiln.stats()["frames_compiled"] == 0


def test_eager_on_recompile_uses_cached_entries_only():
    cf = kiln.compile(_f, dynamic=False)
    calls = [torch.randn(3), torch.randn(3), torch.randn(5), torch.randn(7)]
    cf(calls[0])  # compiled under the default stance
    with torch.compiler.set_stance("eager_on_recompile"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for x in calls[1:]:
            torch.testing.assert_close(cf(x), _f(x))
    assert kiln.stats()["frames_compiled"] == 1 and kiln.stats()["cache_hits"] == 1
    assert kiln.stats()["eager_runs"] == 2  # counted, and warned once
    assert sum("eager_on_recompile" in str(m.message) for m in w) == 1
    # torch.compile's count for the same calls (its first call compiled under default too)
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    cnt = CompileCounter()
    tf = torch.compile(_f, backend=cnt, dynamic=False)
    tf(calls[0])
    with torch.compiler.set_stance("eager_on_recompile"):
        for x in calls[1:]:
            tf(x)
    assert cnt.frame_count == kiln.stats()["frames_compiled"]
    torch._dynamo.reset()


def test_fail_on_recompile_raises_on_a_miss_only():
    cf = kiln.compile(_f, dynamic=False)
    cf(torch.randn(3))
    with torch.compiler.set_stance("fail_on_recompile"):
        x = torch.randn(3)
        torch.testing.assert_close(cf(x), _f(x))
        with pytest.raises(RuntimeError, match="fail_on_recompile.*_f.*size|shape"):
            cf(torch.randn(6))
        with pytest.raises(RuntimeError, match="fail_on_recompile"):  # a first compile, as torch
            kiln.compile(lambda x: x + 1)(x)
    assert kiln.stats()["frames_compiled"] == 1


def test_eager_then_compile_runs_the_first_call_eagerly_then_compiles_dynamic():
    cf = kiln.compile(_f)
    sizes = [3, 5, 7, 9]
    with torch.compiler.set_stance("eager_then_compile"):
        for n in sizes:
            x = torch.randn(n, 2)
            torch.testing.assert_close(cf(x), _f(x))
    # the first call eager; the second compiles with dim 0 dynamic (it moved); no recompiles
    assert kiln.stats()["frames_compiled"] == 1 and kiln.stats()["recompiles"] == 0

    def g(x):  # a code object torch has not seen (it keeps first-call examples per code)
        return x.sin() * 2
    with torch.compiler.set_stance("eager_then_compile"):
        theirs = _torch_frames(g, [(torch.randn(n, 2),) for n in sizes])
    assert theirs == 1


# ---------------------------------------------------------------- torch.compiler.reset

def test_torch_compiler_reset_resets_kiln():
    cf = kiln.compile(_f)
    cf(torch.randn(4))
    assert kiln.stats()["frames_compiled"] == 1 and cf.cache.entries
    torch.compiler.reset()
    assert kiln.stats()["frames_compiled"] == 0 and not cf.cache.entries
    assert torch.compiler.reset.__wrapped__ is not None  # torch's own still runs first
    cf(torch.randn(4))
    assert kiln.stats()["frames_compiled"] == 1  # compiled afresh


# ---------------------------------------------------------------- is_compiling, step markers

def test_is_compiling_is_true_in_the_trace_only():
    def f(x):
        if torch.compiler.is_compiling():
            return x + 1
        return x - 1
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f, fullgraph=True)(x), x + 1)
    torch.testing.assert_close(torch.compile(f, backend="eager", fullgraph=True)(x), x + 1)
    torch.testing.assert_close(f(x), x - 1)


def test_cudagraph_mark_step_begin_is_accepted_in_a_graph():
    def f(x):
        torch.compiler.cudagraph_mark_step_begin()
        return x * 3
    x = torch.randn(4)
    out = kiln.explain(f)(x)
    assert out.graph_break_count == 0 and out.graph_count == 1
    torch.testing.assert_close(kiln.compile(f, fullgraph=True, mode="reduce-overhead")(x), x * 3)


# ---------------------------------------------------------------- assume_constant_result

class _Config:
    calls = 0
    factor = 3

    @torch.compiler.assume_constant_result
    def get_factor(self):
        _Config.calls += 1
        return self.factor


@torch.compiler.assume_constant_result
def _constant_offset():
    _constant_offset.calls += 1
    return _constant_offset.value


_constant_offset.calls, _constant_offset.value = 0, 2.5


def test_assume_constant_result_is_called_once_and_guarded_by_nothing():
    cfg = _Config()

    def f(x):
        return x * cfg.get_factor() + _constant_offset()
    _Config.calls = _constant_offset.calls = 0
    cf = kiln.compile(f, fullgraph=True)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(cf(x), x * 3 + 2.5)
    assert _Config.calls == 1 and _constant_offset.calls == 1  # at trace time only
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["frames_compiled"] == 1
    # guarded by nothing: a changed value is not seen, as torch.compile does not see it
    _constant_offset.value = 100.0
    x = torch.randn(4)
    ours = cf(x)
    torch._dynamo.reset()
    _constant_offset.value = 2.5
    tf = torch.compile(f, backend="eager", fullgraph=True)
    tf(x)
    _constant_offset.value = 100.0
    torch.testing.assert_close(ours, tf(x))
    torch.testing.assert_close(ours, x * 3 + 2.5)
    torch._dynamo.reset()
    _constant_offset.value = 2.5


# ---------------------------------------------------------------- mark_dynamic / mark_static

_MARKS = {"mark_dynamic": torch._dynamo.mark_dynamic, "maybe_mark_dynamic": torch._dynamo.maybe_mark_dynamic,
          "mark_static": torch._dynamo.mark_static, "kiln.mark_dynamic": kiln.mark_dynamic}


@pytest.mark.parametrize("dynamic", [None, True, False])
@pytest.mark.parametrize("mark", list(_MARKS))
def test_dim_marks_match_torch_compiles_frame_counts(mark, dynamic):
    def f(x):
        return (x * 2).sum(0)

    def calls():
        out = []
        for n in range(4, 8):
            t = torch.randn(n, 3)
            _MARKS[mark](t, 0)
            out.append((t,))
        return out
    cf = kiln.compile(f, dynamic=dynamic)
    for (t,) in calls():
        torch.testing.assert_close(cf(t), f(t))
    ours = kiln.stats()["frames_compiled"]
    assert ours == (4 if mark == "mark_static" else 1)
    if not mark.startswith("kiln"):  # torch reads its own marks only
        theirs = _torch_frames(f, calls(), dynamic=dynamic)
        assert ours == theirs, (mark, dynamic, ours, theirs)


# ---------------------------------------------------------------- allow_in_graph

def _scaled_sum(x, n):
    _scaled_sum.calls += 1  # Python the bytecode tracer would replay: runs at trace time only
    y = x
    for _ in itertools.repeat(None, n):  # an iterator kiln's capture breaks on
        y = y * 2 + torch.ones(x.shape[-1], device=x.device)
    return y.sum(-1), y


_scaled_sum.calls = 0
torch.compiler.allow_in_graph(_scaled_sum)


def _uses_allowed(x):
    a, b = _scaled_sum(x, 2)
    return a + 1, b.relu()


def test_allow_in_graph_is_traced_at_the_op_level_without_a_break():
    x = torch.randn(3, 4, requires_grad=True)
    assert torch._dynamo.explain(_uses_allowed)(x).graph_break_count == 0
    out = kiln.explain(_uses_allowed)(x)
    assert out.graph_break_count == 0 and out.graph_count == 1
    _scaled_sum.calls = 0
    cf = kiln.compile(_uses_allowed, fullgraph=True)
    for _ in range(3):
        x = torch.randn(3, 4, requires_grad=True)
        ours, ref = cf(x), _uses_allowed(x)
        for o, r in zip(ours, ref):
            torch.testing.assert_close(o, r)
        g_ours = torch.autograd.grad(ours[0].sum() + ours[1].pow(2).sum(), x)[0]
        g_ref = torch.autograd.grad(ref[0].sum() + ref[1].pow(2).sum(), x)[0]
        torch.testing.assert_close(g_ours, g_ref)
    assert _scaled_sum.calls == 1 + 3  # once at the one compile, then the 3 eager references


@torch.compiler.allow_in_graph
def _data_dependent(x):
    return x * x.sum().item()  # cannot run on meta tensors: kiln inlines it instead


def test_allow_in_graph_falls_back_to_inlining_where_it_cannot_record():
    def f(x):
        return _data_dependent(x) + 1
    for dynamic in (False, True):  # True: symbolic sizes are not recorded either
        kiln.reset()
        cf = kiln.compile(f, dynamic=dynamic)
        for n in (3, 5):
            x = torch.randn(n)
            torch.testing.assert_close(cf(x), f(x))
    g = kiln.compile(_uses_allowed, dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        for o, r in zip(g(x), _uses_allowed(x)):
            torch.testing.assert_close(o, r)


@torch.compiler.assume_constant_result
def _bad_constant():
    raise ValueError("no config here")


def test_assume_constant_result_error_is_the_users_own():
    def f(x):
        return x * _bad_constant()
    with pytest.raises(ValueError, match="no config here"):
        kiln.compile(f)(torch.randn(2))
