"""The public API: compile on functions and modules, the per-code cache, recompiles, the
recompile limit, fallbacks, backends, explain, stats, logs and debug dumps."""
import json
import os
import warnings

import pytest
import torch

import kiln
from kiln.ops.registry import LOWERINGS
from kiln.ops import prims
from testing import assert_close


def transform(x, bias):
    y = x + bias
    y = torch.relu(y)
    return y * 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 16)

    def forward(self, x, bias):
        return torch.relu(self.linear(x) + bias) * 2


def test_decorator_forms():
    @kiln.compile
    def f(x):
        return x.exp() + 1

    @kiln.compile(backend="eager")
    def g(x):
        return x.exp() + 1

    x = torch.randn(5)
    assert_close(f(x), torch.exp(x) + 1)
    assert_close(g(x), torch.exp(x) + 1)


def test_new_dtype_or_shape_recompiles_and_old_one_hits_the_cache():
    f = kiln.compile(transform)
    x, b = torch.randn(8, 4), torch.randn(4)
    assert torch.equal(f(x, b), transform(x, b))
    s = kiln.stats()
    assert (s["frames_compiled"], s["recompiles"], s["cache_hits"]) == (1, 0, 0)
    xh, bh = x.half(), b.half()
    assert_close(f(xh, bh), transform(xh, bh))
    x2, b2 = torch.randn(3, 4), torch.randn(4)
    assert torch.equal(f(x2, b2), transform(x2, b2))
    s = kiln.stats()
    assert (s["frames_compiled"], s["recompiles"]) == (3, 2)
    assert torch.equal(f(x, b), transform(x, b))
    assert_close(f(xh, bh), transform(xh, bh))
    s = kiln.stats()
    assert s["frames_compiled"] == 3 and s["cache_hits"] == 2


def test_recompile_reason_names_the_failed_guard(capsys):
    from kiln import log
    log.configure("recompiles")
    try:
        f = kiln.compile(transform)
        f(torch.randn(8, 4), torch.randn(4))
        f(torch.randn(8, 4, dtype=torch.float64), torch.randn(4))
    finally:
        log.configure("")
    err = capsys.readouterr().err
    assert "recompiling transform" in err and "x.dtype changed: was torch.float32, now torch.float64" in err


def test_recompile_limit_then_eager():
    f = kiln.compile(transform)
    with kiln.config.patch(recompile_limit=2):
        # dtype changes always recompile (a size change would make the size dynamic instead)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            x, b = torch.randn(4, 3, dtype=dtype), torch.randn(3, dtype=dtype)
            assert torch.equal(f(x, b), transform(x, b))
    s = kiln.stats()
    assert s["frames_compiled"] == 2 and s["fallbacks"] == 1


def test_module_shares_parameters_and_sees_in_place_updates():
    m = Model()
    cm = kiln.compile(m)
    assert isinstance(cm, torch.nn.Module)
    assert all(a is b for a, b in zip(cm.parameters(), m.parameters()))
    x, b = torch.randn(3, 8), torch.randn(16)
    with torch.no_grad():
        assert_close(cm(x, b), m(x, b))
        m.linear.weight.mul_(-1.5)
        assert_close(cm(x, b), m(x, b))
    assert kiln.stats()["frames_compiled"] == 1  # the update needed no recompile


def test_module_training_flag_is_guarded():
    m = Model()
    cm = kiln.compile(m)
    x, b = torch.randn(3, 8), torch.randn(16)
    with torch.no_grad():
        cm(x, b)
        m.eval()
        assert_close(cm(x, b), m(x, b))
    assert kiln.stats()["recompiles"] == 1


def test_gradients_still_flow_through_compiled_module():
    m = Model()
    cm = kiln.compile(m)
    x, b = torch.randn(3, 8), torch.randn(16)
    cm(x, b).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x, b).sum().backward()
    for g, p in zip(grads, m.parameters()):
        assert_close(g, p.grad)


def test_unsupported_call_runs_eagerly_with_reason_logged(capsys):
    from kiln import log

    def f(x):
        y = x + 1
        print("side effect")
        return y * 2
    log.configure("graph_breaks")
    try:
        out = kiln.compile(f)(torch.ones(3))
    finally:
        log.configure("")
    assert torch.equal(out, torch.full((3,), 4.0))
    captured = capsys.readouterr()
    assert "side effect" in captured.out
    assert "print" in captured.err and "test_api.py" in captured.err
    e = kiln.explain(f)(torch.ones(3))
    assert e.graph_break_count == 1 and e.break_reasons[0].lineno > 0
    assert "print" in e.break_reasons[0].source_line


def test_fullgraph_turns_a_break_into_an_error_naming_line():
    def f(x):
        print("x")
        return x

    with pytest.raises(kiln.GraphBreakError, match=r"print.*test_api.py:\d+"):
        kiln.compile(f, fullgraph=True)(torch.ones(2))


def test_internal_error_falls_back_with_warning_naming_the_stage(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setitem(LOWERINGS, prims.maximum, broken)
    x, b = torch.randn(4, 4), torch.randn(4)
    with pytest.warns(RuntimeWarning, match="stage 'lowering'"):
        out = kiln.compile(transform)(x, b)
    assert torch.equal(out, transform(x, b))
    assert kiln.stats()["fallbacks"] == 1
    kiln.reset()
    with kiln.config.patch(strict=True), pytest.raises(RuntimeError, match="stage 'lowering'"):
        kiln.compile(transform)(x, b)


def test_user_errors_keep_their_own_traceback():
    def f(x, y):
        return x + y  # shapes do not broadcast

    with pytest.raises(RuntimeError, match="must match the size") as info:
        kiln.compile(f)(torch.ones(3), torch.ones(4))
    assert any(entry.name == "f" for entry in info.traceback)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_backends_agree_with_eager(backend):
    x, b = torch.randn(6, 5), torch.randn(5)
    assert torch.equal(kiln.compile(transform, backend=backend)(x, b), transform(x, b))


def test_stats_and_reset():
    f = kiln.compile(transform)
    x, b = torch.randn(2, 2), torch.randn(2)
    f(x, b)
    f(x, b)
    s = kiln.stats()
    for key in ("frames_compiled", "recompiles", "graph_breaks", "kernels_generated",
                "cache_hits", "disk_cache_hits", "fallbacks"):
        assert key in s
    assert s["kernels_generated"] == 1 and s["cache_hits"] == 1
    kiln.reset()
    assert kiln.stats()["frames_compiled"] == 0


def test_disable_and_graph_break_and_is_compiling():
    assert kiln.is_compiling() is False
    inner = kiln.disable(lambda x: x * 3)
    assert torch.equal(inner(torch.ones(2)), torch.full((2,), 3.0))

    def f(x):
        x = x + 1
        kiln.graph_break()
        return x * 2
    e = kiln.explain(f)(torch.ones(2))
    assert e.graph_break_count == 1 and "graph_break" in e.break_reasons[0].reason


def test_explain_summary_is_readable():
    e = kiln.explain(transform)(torch.randn(4, 4), torch.randn(4))
    text = str(e)
    assert "Graphs: 1" in text and "Kernels: 1" in text and "core.relu" in text
    assert "L['x'].shape == (4, 4)" in text
    assert e.ops_per_graph == [3] and e.compile_times["capture"] > 0


def test_logs_help_lists_channels():
    from kiln import log
    text = log.help_text()
    for ch in ("graph", "guards", "recompiles", "output_code", "schedule"):
        assert ch in text


def test_output_code_channel_prints_kernel_and_wrapper(capsys):
    from kiln import log
    log.configure("graph,guards,output_code")
    try:
        kiln.compile(transform)(torch.randn(4, 4), torch.randn(4))
    finally:
        log.configure("")
    err = capsys.readouterr().err
    assert "def call(" in err and "kiln_kernel0" in err and "core.add" in err and "def guard" in err


def test_debug_dump_writes_one_file_per_stage(tmp_path):
    import kiln.observe.debug as debug
    debug._run_dir = None
    with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
        kiln.compile(transform)(torch.randn(4, 4), torch.randn(4))
    debug._run_dir = None
    (run,) = os.listdir(tmp_path)
    (comp,) = os.listdir(tmp_path / run)
    files = sorted(os.listdir(tmp_path / run / comp))
    for name in ("00_bytecode.txt", "01_guards.py", "02_captured_graph.py", "03_prims_graph.py",
                 "04_loop_ir.txt", "05_loop_ir_fused.txt", "07_wrapper.py", "metrics.json"):
        assert name in files
    assert any(f.startswith("06_kernel_") for f in files)
    metrics = json.loads((tmp_path / run / comp / "metrics.json").read_text())
    assert metrics["kernel_count"] == 1
    # graph files are runnable
    import runpy
    runpy.run_path(str(tmp_path / run / comp / "03_prims_graph.py"), run_name="__main__")
    # so is the fused loop IR as Python: its call() computes the function
    x, b = torch.randn(4, 4), torch.randn(4)
    (out,) = runpy.run_path(str(tmp_path / run / comp / "05a_loop_ir.py"))["call"](x, b)
    assert_close(out, transform(x, b))


def test_warnings_are_not_raised_on_the_happy_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.compile(transform)(torch.randn(3, 3), torch.randn(3))


def test_compile_options_never_share_entries():
    """One function compiled with another backend or with fullgraph gets its own entries: the
    kiln compile after an eager-backend one generates kernels, and fullgraph=True still raises
    at a break an earlier compile resumed."""
    import io
    import contextlib

    def f(x):
        y = x.sin()
        print("break")
        return y * 2
    x = torch.randn(4)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
        assert kiln.stats()["kernels_generated"] == 0
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
        assert kiln.stats()["kernels_generated"] > 0, kiln.stats()
        with pytest.raises(kiln.GraphBreakError):
            kiln.compile(f, fullgraph=True)(x)
