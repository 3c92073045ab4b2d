"""No silent eager (issue 25): every frame kiln runs natively warns once with the reason and the
line, counts in kiln.stats()["eager_runs"], and shows in kiln.explain and the report."""
import json
import os
import warnings

import torch

import kiln
from kiln import eager_runs
from kiln.ops.registry import LOWERINGS
from kiln.ops import prims


def _eager_warnings(record):
    return [w for w in record if "runs eagerly" in str(w.message)]


def _run(fn, *args, n=3):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(n):
            out = fn(*args)
    return out, _eager_warnings(record)


def test_recompile_limit_warns_once_and_counts_every_eager_call():
    def f(x):
        return x * 2

    cf = kiln.compile(f, dynamic=False)
    with kiln.config.patch(recompile_limit=2):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for n in range(1, 7):
                x = torch.randn(n)
                torch.testing.assert_close(cf(x), f(x))
    ws = _eager_warnings(record)
    assert len(ws) == 1, [str(w.message) for w in ws]
    msg = str(ws[0].message)
    assert "recompile limit (2)" in msg and "test_eager_runs.py" in msg and "def f(x):" in msg
    assert kiln.stats()["eager_runs"] == 4  # calls 3..6
    (rec,) = eager_runs.records()
    assert rec["count"] == 4 and rec["lineno"] == f.__code__.co_firstlineno


def _unrebuildable_break(x):
    f = torch.vmap(torch.sin)  # live across the break: the glue cannot make it again
    y = x * 2
    print("break")
    return f(y) + 1


def test_break_that_cannot_resume_warns_with_the_break_line(capsys):
    inner = _unrebuildable_break
    x = torch.randn(4)
    out, ws = _run(kiln.compile(inner), x)
    torch.testing.assert_close(out, torch.sin(x * 2) + 1)
    assert len(ws) == 1
    msg = str(ws[0].message)
    assert "cannot be resumed" in msg and "print(\"break\")" in msg, msg
    assert kiln.stats()["eager_runs"] == 3
    e = kiln.explain(inner)(x)
    assert len(e.eager_runs) == 1 and e.eager_runs[0].count == 1
    assert e.eager_runs[0].source_line == 'print("break")'
    assert "cannot be resumed" in e.eager_runs[0].reason and "Eager:" in str(e)


def _while_break(x):
    i = 0
    while i < 2:
        x = x + 1
        kiln.graph_break()
        i += 1
    return x


def test_the_eagerly_run_rest_of_a_frame_after_a_break_is_noted():
    x = torch.randn(4)
    out, ws = _run(kiln.compile(_while_break), x)
    torch.testing.assert_close(out, _while_break(x))
    assert len(ws) == 1 and "runs uncompiled" in str(ws[0].message), [str(w.message) for w in ws]
    assert "kiln.graph_break()" in str(ws[0].message)
    assert kiln.stats()["eager_runs"] == 3
    e = kiln.explain(_while_break)(x)
    assert [r.lineno for r in e.eager_runs] == [_while_break.__code__.co_firstlineno + 4]


def _transform(x, b):
    return torch.maximum(x, b).sum(0)


def test_internal_error_warns_once_counts_and_explains(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setitem(LOWERINGS, prims.maximum, broken)
    x, b = torch.randn(4, 4), torch.randn(4)
    out, ws = _run(kiln.compile(_transform), x, b)
    assert torch.equal(out, _transform(x, b))
    assert len(ws) == 1 and "stage 'lowering'" in str(ws[0].message)
    assert kiln.stats()["eager_runs"] == 3 and kiln.stats()["fallbacks"] == 1
    e = kiln.explain(_transform)(x, b)
    assert len(e.eager_runs) == 1 and "boom" in e.eager_runs[0].reason


def test_eager_runs_are_in_the_debug_dump_and_the_report(tmp_path):
    from kiln.observe import debug, report

    def f(x):
        return x * 3

    cf = kiln.compile(f, dynamic=False)
    with kiln.config.patch(debug=True, debug_dir=str(tmp_path), recompile_limit=1), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        debug.new_run()
        for n in (2, 3, 4):
            cf(torch.randn(n))
        run = debug.run_dir()
    debug.end_run()
    (rec,) = json.load(open(os.path.join(run, "eager_runs.json")))
    assert "recompile limit" in rec["reason"] and rec["source_line"] == "def f(x):"
    html = report.render(run)
    assert "Eager runs" in html and "recompile limit (1)" in html


def test_compiled_frames_are_not_noted():
    def f(x):
        return x.sin()
    x = torch.randn(3)
    _, ws = _run(kiln.compile(f), x)
    assert not ws and kiln.stats()["eager_runs"] == 0


def test_the_warning_points_at_the_users_call():
    def f(x):
        return x + 1

    cf = kiln.compile(f, dynamic=False)
    with kiln.config.patch(recompile_limit=1), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cf(torch.randn(1))
        cf(torch.randn(2))  # this line
    (w,) = _eager_warnings(record)
    assert w.filename == __file__ and "cf(torch.randn(2))" in open(__file__).read().splitlines()[w.lineno - 1]


def test_an_op_refused_at_capture_that_eager_runs_is_noted_per_call(monkeypatch):
    """An op's capture rule raising (kiln's own gap, when eager torch accepts the call) runs the
    call eagerly: noted, and counted each call."""
    from kiln.capture import torch_api

    def refuse(*a, **k):
        raise ValueError("this capture rule refuses")
    monkeypatch.setitem(torch_api.TORCH_FUNCTIONS, torch.cos, refuse)

    def f(x):
        return torch.cos(x) + 1

    x = torch.randn(4)
    out, ws = _run(kiln.compile(f), x)
    torch.testing.assert_close(out, f(x))
    assert len(ws) == 1 and "capture refused" in str(ws[0].message), [str(w.message) for w in ws]
    assert "torch.cos(x) + 1" in str(ws[0].message)
    assert kiln.stats()["eager_runs"] == 3
