"""A value rebuilt at a graph break is one object (issue 24, peer ``test_dict_update``).

A rebuildable tracker (an OrderedDict) was rebuilt each time the break glue loaded it, so the
receiver of the method run at the break and the local the resumed code reads were two dicts:
``od.move_to_end`` or ``od.update`` at a break changed a copy, and the resumed code lost the
change (a KeyError, or a result without the key). Also here: ``dict.update`` of an iterable of
pairs is traced (no break), and ``x.size()`` is a ``torch.Size`` (``Tensor.new(x.size())`` is a
size, not data).
"""
from __future__ import annotations

import collections

import torch

import kiln


def _run(fn, *args):
    kiln.reset()
    got, want = kiln.compile(fn)(*args), fn(*args)
    return got, want, kiln.stats()


def test_a_dict_mutated_by_the_call_at_a_break_is_the_resumed_codes_dict():
    def fn(x, z):
        od = collections.OrderedDict(a=x * 3, b=z)
        od.move_to_end("a")  # not modeled: a graph break, run by the glue on the rebuilt dict
        od["c"] = z - 7
        return od["a"] + od["c"], list(od)
    x, z = torch.randn(3), torch.randn(3)
    got, want, stats = _run(fn, x, z)
    assert got[1] == want[1] == ["b", "a", "c"]
    assert torch.allclose(got[0], want[0])
    assert stats["graph_breaks"] >= 1 and stats["eager_runs"] == 0


def test_dict_update_with_pairs_is_traced():
    def fn(x, y, z):
        dd = {"a": x, "b": y}
        dd.update([("b", z + 1), ["c", z]])
        od = collections.OrderedDict(a=x * 3, b=y + 2)
        od.update([["b", z + 6], ("c", z - 7)])
        od.update(zip("ab", [z - 3, x + 2]))
        return dd.get("a") * od.get("a") + od.get("c") + dd.get("b") + od.get("b") * dd.get("c"), od
    args = [torch.randn(4) for _ in range(3)]
    got, want, stats = _run(fn, *args)
    assert torch.allclose(got[0], want[0])
    assert type(got[1]) is collections.OrderedDict and list(got[1]) == list(want[1])
    assert stats["graph_breaks"] == 0 and stats["eager_runs"] == 0


def test_tensor_new_of_a_traced_size_is_that_size():
    def fn(x):
        y = torch.ones(5, 8) * x.sum()
        z = x.new(y.size())
        return z.shape, y.size(), type(y.size()), z.dtype
    got, want, stats = _run(fn, torch.randn(3))
    assert got == want and got[0] == torch.Size([5, 8]) and got[2] is torch.Size
    assert stats["eager_runs"] == 0
