"""``collections.defaultdict`` in captured code (capture/values_defaultdict.py): a miss calls
the factory in the trace (``int``, ``list``, a lambda, a user class) and stores its result;
an input defaultdict is guarded by type, keys and factory and written back in place; one made
in the trace comes back as a real defaultdict with the same factory. Each is compared with
eager, in one graph with no break where Dynamo has none."""
import collections

import pytest
import torch

import kiln


def one_graph(fn, *args):
    """explain(fn) on copies of args: one graph, no break; returns its result."""
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    return out.result


def counts(x, words):
    d = collections.defaultdict(int)
    for w in words:
        d[w] += 1
    return x * d["a"] + d["b"], d


def test_int_factory_counts_and_comes_back_as_a_defaultdict():
    x, words = torch.randn(3), ["a", "b", "a", "c"]
    out, d = one_graph(counts, x, words)
    want, want_d = counts(x, words)
    torch.testing.assert_close(out, want)
    assert type(d) is collections.defaultdict and d.default_factory is int
    assert d == want_d
    assert d["zz"] == 0  # still a defaultdict for the caller


def grouped(x):
    d = collections.defaultdict(list)
    d["even"].append(x * 2)
    d["odd"].append(x + 1)
    d["even"].append(x - 3)
    return torch.stack(d["even"]).sum(0) + d["odd"][0], len(d), d


def test_list_factory():
    x = torch.randn(4)
    out, n, d = one_graph(grouped, x)
    want, want_n, want_d = grouped(x)
    torch.testing.assert_close(out, want)
    assert n == want_n == 2
    assert type(d) is collections.defaultdict and d.default_factory is list
    assert list(d) == ["even", "odd"] and len(d["even"]) == 2
    torch.testing.assert_close(d["even"][1], want_d["even"][1])


def lambda_tensor_entry(x):
    acc = collections.defaultdict(lambda: torch.zeros(3))
    acc["z"] += x        # a miss: the lambda runs in the graph, the result is stored
    acc["z"] += x * 2
    acc["w"]
    return acc["z"] * 2 + acc["w"], sorted(acc)


def test_lambda_factory_makes_a_tensor_entry():
    x = torch.randn(3)
    out, keys = one_graph(lambda_tensor_entry, x)
    want, want_keys = lambda_tensor_entry(x)
    torch.testing.assert_close(out, want)
    assert keys == want_keys == ["w", "z"]


class Tally:
    def __init__(self):
        self.n = 0
        self.total = 0.0


def user_class(x, names):
    d = collections.defaultdict(Tally)
    for name, scale in names:
        d[name].n += 1
        d[name].total += scale
    return x * d["a"].total + d["b"].n, d.default_factory is Tally


def test_user_class_factory():
    x, names = torch.randn(3), [("a", 0.5), ("b", 2.0), ("a", 1.5)]
    out, same = one_graph(user_class, x, names)
    want, _ = user_class(x, names)
    torch.testing.assert_close(out, want)
    assert same is True


def record(x, log):
    log["calls"].append(x.sum())
    log["count"] += 1 if log.default_factory is int else 0
    return x * 2


def test_input_defaultdict_is_mutated_in_place():
    log = collections.defaultdict(list, {"count": 3})
    eager_log = collections.defaultdict(list, {"count": 3})
    x = torch.randn(3)
    kiln.reset()
    out = kiln.explain(record, backend="eager")(x, log)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    want = record(x, eager_log)
    torch.testing.assert_close(out.result, want)
    assert type(log) is collections.defaultdict and log.default_factory is list
    assert list(log) == list(eager_log) == ["count", "calls"]
    torch.testing.assert_close(log["calls"][0], eager_log["calls"][0])
    assert log["count"] == eager_log["count"] == 3


def into_input(x, acc):
    acc["sum"] += x          # a miss on the first call: the factory's tensor is stored
    acc["n"] += 1 if "sum" in acc else 0
    return acc["sum"] * 2


def test_compiled_calls_write_back_every_call():
    zeros = lambda: torch.zeros(3)  # noqa: E731
    compiled = kiln.compile(into_input, backend="eager")
    kiln.reset()
    x = torch.randn(3)
    got, want = collections.defaultdict(zeros), collections.defaultdict(zeros)
    for _ in range(3):  # a miss, then hits (new keys: a recompile)
        torch.testing.assert_close(compiled(x, got), into_input(x, want))
    assert list(got) == list(want)
    torch.testing.assert_close(got["sum"], want["sum"])
    torch.testing.assert_close(got["n"], want["n"])
    assert kiln.stats().get("graph_breaks", 0) == 0


def first_missing(x, d):
    return x + len(d["missing"]) if isinstance(d["missing"], list) else x * d["missing"] + 100


def test_changed_factory_recompiles():
    kiln.reset()
    compiled = kiln.compile(first_missing, backend="eager")
    x = torch.randn(3)
    for factory in (list, list, int, float):
        got, want = collections.defaultdict(factory), collections.defaultdict(factory)
        torch.testing.assert_close(compiled(x, got), first_missing(x, want))
        assert got == want and got.default_factory is factory
    assert kiln.stats()["recompiles"] == 2


def read_key(x, d):
    return x * d["k"]


def test_changed_keys_recompile():
    kiln.reset()
    compiled = kiln.compile(read_key, backend="eager")
    x = torch.randn(3)
    a = collections.defaultdict(int, {"k": 2})
    torch.testing.assert_close(compiled(x, a), read_key(x, collections.defaultdict(int, {"k": 2})))
    b = collections.defaultdict(int)   # "k" now missing: the factory fills it
    torch.testing.assert_close(compiled(x, b), x * 0)
    assert dict(b) == {"k": 0}
    assert kiln.stats()["recompiles"] == 1 and kiln.stats().get("graph_breaks", 0) == 0


def factory_reads(x):
    d = collections.defaultdict(list, a=[1])
    e = d.copy()
    e["b"].append(2)
    f = collections.defaultdict()
    return x + len(e) + ("b" in d) + (d.get("c") is None) + (f.default_factory is None) + len(d), e


def test_default_factory_get_contains_copy():
    x = torch.randn(3)
    out, e = one_graph(factory_reads, x)
    want, want_e = factory_reads(x)
    torch.testing.assert_close(out, want)
    assert type(e) is collections.defaultdict and e.default_factory is list and e == want_e


def across_break(x):
    d = collections.defaultdict(lambda: torch.ones(2))
    d["a"] = d["a"] + x
    kiln.graph_break()
    d["b"] += x
    return d


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_made_defaultdict_lives_across_a_break():
    x = torch.randn(2)
    kiln.reset()
    out = kiln.explain(across_break, backend="eager")(x)
    assert out.graph_break_count == 1
    got, want = out.result, across_break(x)
    assert type(got) is collections.defaultdict and list(got) == ["a", "b"]
    torch.testing.assert_close(got["b"], want["b"])
    torch.testing.assert_close(got["new"], torch.ones(2))  # its factory, as in eager


def get_key(x, d):
    return x * d.get("k", 1)


def test_guards_do_not_insert_missing_keys():
    """The guards read items with dict.get: ``d[k]`` (and dict.__getitem__) would run the
    factory on a call whose object lacks the key, inserting it into the caller's object."""
    kiln.reset()
    compiled = kiln.compile(get_key, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x, collections.defaultdict(int, {"k": 2})), x * 2)
    for other in (collections.defaultdict(int), collections.defaultdict(int, {"j": 3})):
        before = dict(other)
        torch.testing.assert_close(compiled(x, other), get_key(x, collections.defaultdict(int, before)))
        assert dict(other) == before
    assert kiln.stats().get("graph_breaks", 0) == 0


def from_keys(x, y):
    d1 = dict.fromkeys(["a", "b"], x + 1)
    d2 = collections.defaultdict.fromkeys(iter(d1), x - 2)
    d3 = collections.OrderedDict.fromkeys(("a", "b"), value=y)
    return d1["a"] * d2["b"] + d3["a"], d2, d3


def test_fromkeys_of_defaultdict_and_ordereddict():
    """PyTorch's test_dict_fromkeys: the class's fromkeys with a tensor value (a defaultdict's
    has no factory), not a break."""
    x, y = torch.randn(3), torch.randn(3)
    out, d2, d3 = one_graph(from_keys, x, y)
    want, want_d2, _ = from_keys(x, y)
    torch.testing.assert_close(out, want)
    assert type(d2) is collections.defaultdict and d2.default_factory is None
    assert type(d3) is collections.OrderedDict and list(d3) == ["a", "b"]
    torch.testing.assert_close(d2["a"], want_d2["a"])
