"""Eager fallbacks stay as small as their cause (issues 24 and 25): an internal error falls back
only for calls like the one that failed, and the recompile limit says so in a warning."""
import warnings

import pytest
import torch

import kiln
from kiln import pipeline


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def pointwise(x):
    return torch.sin(x) * 2 + 1


def _fails_for_float64(real):
    def decompose(graph, *a, **kw):
        if any(p.meta["val"].dtype == torch.float64 for p in graph.placeholders):
            raise RuntimeError("injected decomposition failure")
        return real(graph, *a, **kw)
    return decompose


def test_an_internal_error_falls_back_only_for_its_entry(monkeypatch):
    monkeypatch.setattr(pipeline, "decompose", _fails_for_float64(pipeline.decompose))
    f = kiln.compile(pointwise, backend="aot_eager")
    x64 = torch.randn(5, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="decomp"):
        torch.testing.assert_close(f(x64), pointwise(x64))
    assert kiln.stats()["fallbacks"] == 1
    x32 = torch.randn(5)
    torch.testing.assert_close(f(x32), pointwise(x32))  # another dtype compiles
    assert kiln.stats()["frames_compiled"] == 1 and kiln.stats()["graphs_compiled"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the failed entry now runs eagerly without a new attempt
        x64 = torch.randn(5, dtype=torch.float64)
        torch.testing.assert_close(f(x64), pointwise(x64))
    assert kiln.stats()["fallbacks"] == 1 and kiln.stats()["frames_compiled"] == 1
    assert not [c for c in kiln.api._CODE_CACHES.values() if c.eager_reason]


def test_an_internal_error_in_capture_falls_back_for_those_arguments(monkeypatch):
    real = kiln.api.trace

    def trace(fn, args, kwargs, **kw):
        if args[0].dtype == torch.float64:
            raise KeyError("injected capture failure")
        return real(fn, args, kwargs, **kw)
    monkeypatch.setattr(kiln.api, "trace", trace)
    f = kiln.compile(pointwise, backend="eager")
    x64 = torch.randn(5, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="capture"):
        torch.testing.assert_close(f(x64), pointwise(x64))
    x32 = torch.randn(5)
    torch.testing.assert_close(f(x32), pointwise(x32))
    assert kiln.stats()["frames_compiled"] == 1
    torch.testing.assert_close(f(x64), pointwise(x64))
    assert kiln.stats()["fallbacks"] == 1


def test_the_recompile_limit_warns_once_with_the_reason_and_line():
    f = kiln.compile(pointwise, backend="eager")
    with kiln.config.patch(recompile_limit=2):
        f(torch.randn(2, dtype=torch.float64))
        f(torch.randn(2, dtype=torch.float32))
        with pytest.warns(RuntimeWarning) as caught:
            x = torch.randn(2, dtype=torch.float16)
            torch.testing.assert_close(f(x), pointwise(x))
        text = str(caught[0].message)
        assert "recompile limit (2)" in text and "dtype" in text, text
        assert f"{__file__}:{pointwise.__code__.co_firstlineno}" in text, text
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per code object
            f(torch.randn(2, dtype=torch.bfloat16))
    assert kiln.stats()["eager_runs"] >= 1
