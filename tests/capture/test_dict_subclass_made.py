"""Dict subclasses written in Python, made in the traced code (``CustomDictSubclass(k=v)``,
whose construction is OrderedDict's or dict's) and returned: one graph, and the caller gets an
object of that class, as in eager. An input subclass object that is returned is the caller's
own object. (PyTorch's test_functions.py::test_custom_dict_kwargs came back a plain dict.)"""
import collections

import pytest
import torch

import kiln


class CustomDictSubclass(collections.OrderedDict):
    pass


class PlainSub(dict):
    def total(self):
        return sum(self.values())


class LoudSet(dict):
    def __setitem__(self, key, value):  # OrderedDict/dict construction would not call this
        super().__setitem__(key, value * 2)


def made(x):
    z = CustomDictSubclass(sample=torch.ones(3), scaled=x * 2)
    p = PlainSub({"a": x + 1})
    p["b"] = x - 1
    return z, p, p.total()


def test_made_in_the_trace_keeps_its_class():
    x = torch.randn(3)
    kiln.reset()
    out = kiln.explain(made, backend="eager")(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    (z, p, total), (wz, wp, wtotal) = out.result, made(x)
    assert type(z) is CustomDictSubclass and list(z) == ["sample", "scaled"]
    assert type(p) is PlainSub and list(p) == ["a", "b"]
    torch.testing.assert_close(z["scaled"], wz["scaled"])
    torch.testing.assert_close(total, wtotal)


def returned_input(x, d):
    d["y"] = x + 1
    return d


def test_a_returned_input_is_the_callers_object():
    compiled = kiln.compile(returned_input, backend="eager")
    kiln.reset()
    d = CustomDictSubclass(a=1)
    got = compiled(torch.ones(2), d)
    assert got is d and list(d) == ["a", "y"]
    assert kiln.stats().get("graph_breaks", 0) == 0


def across_break(x):
    z = CustomDictSubclass(a=x + 1)
    kiln.graph_break()
    z["b"] = x * 2
    return z


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_made_one_lives_across_a_break():
    x = torch.randn(2)
    kiln.reset()
    out = kiln.explain(across_break, backend="eager")(x)
    assert out.graph_break_count == 1
    assert type(out.result) is CustomDictSubclass and list(out.result) == ["a", "b"]
    torch.testing.assert_close(out.result["b"], x * 2)


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_own_setitem_is_not_made_in_the_trace():
    def fn(x):
        return LoudSet(a=x)
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(torch.ones(2))
    assert type(out.result) is LoudSet
    torch.testing.assert_close(out.result["a"], torch.ones(2))
