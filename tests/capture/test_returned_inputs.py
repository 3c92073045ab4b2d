"""A dict, OrderedDict, defaultdict or list from the inputs that the frame returns is the
caller's own object, with the frame's writes applied (rebuild._output_spec: a ``source`` spec),
as in eager; before, it came back as a new container holding the same items."""
import collections

import pytest
import torch

import kiln


def writes_and_returns(x, d):
    d["y"] = x + 1
    d.pop("gone", None)
    return d, x * 2


@pytest.mark.parametrize("kind", [dict, collections.OrderedDict])
def test_returned_input_dict_is_the_callers_object(kind):
    compiled = kiln.compile(writes_and_returns)
    x = torch.randn(3)
    for _ in range(3):  # the first call traces, the later ones run the cached graph
        d = kind(a=1, gone=2)
        got, y = compiled(x, d)
        assert got is d and type(got) is kind
        assert list(d) == ["a", "y"]
        torch.testing.assert_close(d["y"], x + 1)
        torch.testing.assert_close(y, x * 2)


def test_one_graph_no_break():
    kiln.reset()
    out = kiln.explain(writes_and_returns, backend="eager")(torch.randn(2), {"a": 1})
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons


def test_unchanged_dict_nested_in_the_result():
    def fn(x, d):
        return {"inner": d, "out": x + d["w"]}
    compiled = kiln.compile(fn)
    d = {"w": torch.ones(2)}
    out = compiled(torch.zeros(2), d)
    assert out["inner"] is d
    torch.testing.assert_close(out["out"], torch.ones(2))


def test_defaultdict_and_list_inputs_come_back_themselves():
    def fn(x, dd, xs):
        dd["k"].append(x)
        xs.append(x * 3)
        return dd, xs
    compiled = kiln.compile(fn)
    for _ in range(2):
        dd, xs = collections.defaultdict(list), [1]
        got_dd, got_xs = compiled(torch.ones(2), dd, xs)
        assert got_dd is dd and got_xs is xs
        assert len(dd["k"]) == 1 and len(xs) == 2
        torch.testing.assert_close(xs[1], torch.full((2,), 3.0))


def test_a_copy_is_still_a_new_object():
    def fn(x, d):
        c = dict(d)
        c["x"] = x
        return c
    d = {"a": 1}
    got = kiln.compile(fn)(torch.ones(1), d)
    assert got is not d and "x" not in d and list(got) == ["a", "x"]
