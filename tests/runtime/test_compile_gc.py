"""The cyclic GC during compiles (kiln/context.py): the heap is frozen while a compile runs and
unfrozen when the last one ends; a process's own freeze is left alone; results are unchanged."""
import gc
import threading

import torch

import kiln
from kiln import context
from kiln.graph import passes as graph_passes


def _fn(x, y):
    return torch.relu(x * y + 1).sum(-1)


def _seen_inside(monkeypatch):
    """(freeze count, gc enabled) at each dce pass: observed from inside the compile."""
    seen = []
    orig = graph_passes.dce

    def spy(graph, *a, **k):
        seen.append((gc.get_freeze_count(), gc.isenabled()))
        return orig(graph, *a, **k)
    monkeypatch.setattr("kiln.pipeline.dce", spy)
    return seen


def _unfrozen() -> bool:
    """No heap freeze: at most the interpreter's startup objects are frozen (375 on Ubuntu's
    CPython 3.12, 0 on most builds; our unfreeze returns them too)."""
    return gc.get_freeze_count() <= context.STARTUP_FROZEN


def test_freeze_during_compile_and_unfreeze_after(monkeypatch):
    assert _unfrozen()
    seen = _seen_inside(monkeypatch)
    live = [object() for _ in range(100)]  # tracked objects that existed before the compile
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    out = kiln.compile(_fn)(x, y)
    torch.testing.assert_close(out, _fn(x, y))
    assert seen and all(count >= context.STARTUP_FROZEN + len(live) and enabled
                         for count, enabled in seen)
    assert _unfrozen() and gc.isenabled()


def test_garbage_from_before_is_collected_after(monkeypatch):
    class Cycle:
        pass
    a = Cycle()
    a.self = a
    ref = __import__("weakref").ref(a)
    del a
    x = torch.randn(3, 5)
    kiln.compile(lambda t: t.exp() + 1)(x)
    gc.collect()
    assert ref() is None


def test_a_process_freeze_is_left_alone(monkeypatch):
    seen = _seen_inside(monkeypatch)
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        x, y = torch.randn(2, 6), torch.randn(2, 6)
        torch.testing.assert_close(kiln.compile(_fn)(x, y), _fn(x, y))
        # (frozen objects that die leave the count; a freeze of ours would add the whole
        # heap's new objects, an unfreeze would empty it)
        assert seen and all(frozen // 2 < count <= frozen for count, _ in seen)
        assert frozen // 2 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_off_mode_disables_and_restores(monkeypatch):
    seen = _seen_inside(monkeypatch)
    with kiln.config.patch(compile_gc="off"):
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        torch.testing.assert_close(kiln.compile(_fn)(x, y), _fn(x, y))
    assert seen and not any(enabled for _, enabled in seen)
    assert gc.isenabled() and _unfrozen()


def test_on_mode_leaves_gc_alone(monkeypatch):
    seen = _seen_inside(monkeypatch)
    with kiln.config.patch(compile_gc="on"):
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        torch.testing.assert_close(kiln.compile(_fn)(x, y), _fn(x, y))
    assert seen and all(count <= context.STARTUP_FROZEN and enabled for count, enabled in seen)


def test_overlapping_compiles_unfreeze_once_the_last_ends():
    started, release = threading.Event(), threading.Event()
    counts = []

    def other():
        with context.compiling("other"):
            started.set()
            release.wait(10)
            counts.append(gc.get_freeze_count())
    t = threading.Thread(target=other)
    t.start()
    started.wait(10)
    with context.compiling("mine"):
        assert not _unfrozen()
    assert not _unfrozen()  # the other thread's compile still runs
    release.set()
    t.join(10)
    assert counts and counts[0] > context.STARTUP_FROZEN
    assert _unfrozen()


def test_an_error_inside_a_compile_still_unfreezes():
    try:
        with context.compiling("boom"):
            assert not _unfrozen()
            raise ValueError("boom")
    except ValueError:
        pass
    assert _unfrozen() and gc.isenabled()


def test_an_interpreter_startup_freeze_is_not_a_heap_freeze(monkeypatch):
    # Ubuntu's CPython 3.12 starts with 375 objects frozen; kiln must still freeze its compiles
    real = gc.get_freeze_count
    monkeypatch.setattr(context, "STARTUP_FROZEN", 375 + real())  # (real: this host's own, if any)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 375 + real())
    assert not context.program_froze_heap()
    seen = _seen_inside(monkeypatch)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(kiln.compile(_fn)(x, y), _fn(x, y))
    assert seen and all(count > 375 + 1000 for count, _ in seen)  # the heap was frozen
    # a program's own freeze after kiln's import, or a large count at import, is left alone
    monkeypatch.setattr(context, "STARTUP_FROZEN", 375)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 375 + 50_000)
    assert context.program_froze_heap()
    monkeypatch.setattr(context, "STARTUP_FROZEN", 200_000)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 150_000)
    assert context.program_froze_heap()
