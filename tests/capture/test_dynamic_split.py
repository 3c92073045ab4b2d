"""split and chunk by symbolic sizes: the pieces' bounds stay expressions, their count is
guarded, and nothing runs eagerly (a SymInt split size once sent the whole frame to eager)."""
import pytest
import torch

import kiln


def _run(fn, shapes):
    g = kiln.compile(fn, dynamic=True)
    for shape in shapes:
        x = torch.randn(*shape)
        got, want = g(x), fn(x)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.stride() == b.stride()
            torch.testing.assert_close(a, b)
    return kiln.stats()


def test_split_by_a_symbolic_size_is_compiled_once():
    # a fused projection split three ways by the model width: three pieces at every width
    stats = _run(lambda x: torch.cat([x, x, x], dim=1).split(x.shape[1], dim=1), [(2, 4), (3, 7), (5, 9)])
    assert stats["eager_runs"] == 0 and stats["recompiles"] == 0, stats


def test_split_with_a_ragged_last_piece():
    # the count changes with the size: a new count is a recompile, never a wrong answer
    def fn(x):
        return x.split(4, dim=0)
    stats = _run(fn, [(10, 3), (11, 3), (13, 3)])
    assert stats["eager_runs"] == 0, stats


@pytest.mark.parametrize("chunks", [2, 3])
def test_chunk_of_a_symbolic_size(chunks):
    def fn(x):
        return x.t().chunk(chunks, dim=1)
    stats = _run(fn, [(6, 5), (8, 5), (12, 4)])
    assert stats["eager_runs"] == 0, stats


def test_split_by_sections_of_symbolic_sizes():
    def fn(x):
        n = x.shape[0]
        return x.split([n - 2, 2], dim=0)
    stats = _run(fn, [(5, 3), (7, 3), (9, 2)])
    assert stats["eager_runs"] == 0 and stats["recompiles"] == 0, stats
