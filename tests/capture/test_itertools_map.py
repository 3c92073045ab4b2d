"""Lazy iterators (capture/values_iterators.py) and builtins_iter.py: ``map`` with a user
function (called as the map is consumed, in eager's order), ``itertools.islice``, ``count``,
``zip_longest``, ``accumulate``, ``zip`` over lazy sources, and ``min``/``max`` of tensors
and numbers and with ``key=``. Each case matches eager in one graph with no break (PyTorch's
test_functions test_islice_chain, test_map_sum and test_min_max broke)."""
import itertools

import pytest
import torch

import kiln


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    return out.result


def same(got, want):
    if isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want


def check(fn, *args):
    same(one_graph(fn, *args), fn(*args))


# ---------------------------------------------------------------- PyTorch's cases
def islice_chain(a, b):
    tmp1 = [a + 1, a + 2]
    tmp2 = [a + 3, a + 4]
    a, b = list(itertools.islice(itertools.chain(tmp1, tmp2), 1, 3))
    c = next(itertools.islice(tmp1, 1, None))
    return a - b / c


def map_sum(a, b, c, f):
    return sum(map(lambda x: x + 1, [a, b, c, f]))


def min_max(a, b):
    c = a + b
    a = a.sum()
    b = b.sum()
    a = min(max(a, 0), 1)
    b = max(0, min(1, b))
    return max(a, b) - min(a, b) + c


@pytest.mark.parametrize("fn,n", [(islice_chain, 2), (map_sum, 4), (min_max, 2)])
def test_peer_cases(fn, n):
    for scale in (1.0, 0.01):  # min_max: both sides of its clamps
        check(fn, *[torch.randn(5) * scale for _ in range(n)])


# ---------------------------------------------------------------- map is lazy
def map_in_order(x):
    log = []

    def f(t):
        log.append(len(log))
        return t * (len(log) + 1)
    out = []
    for y in map(f, [x, x + 1, x + 2]):
        log.append(-1)      # the loop body runs between the calls, as in eager
        out.append(y)
    return out, log


def test_map_calls_its_function_as_items_are_taken():
    x = torch.randn(3)
    got, log = one_graph(map_in_order, x)
    want, want_log = map_in_order(x)
    assert log == want_log == [0, -1, 2, -1, 4, -1]
    same(got, want)


def map_forms(x, y):
    pairs = list(map(lambda a, b: a * b, [x, y, x], (y, x)))  # stops at the shorter
    nested = tuple(map(torch.relu, map(lambda t: t - 1, [x, y])))
    first = next(map(lambda t: t.sum(), [y, x]))
    return pairs, nested, first


def test_map_of_several_iterables_nested_and_next():
    check(map_forms, torch.randn(4), torch.randn(4))


def islice_of_map(x):
    calls = []

    def f(t):
        calls.append(1)
        return t + len(calls)
    # takes items 0..4 of the map: the last one while looking for index 5 (CPython's islice)
    taken = list(itertools.islice(map(f, [x] * 6), 1, 5, 2))
    return taken, len(calls)


def test_islice_takes_only_what_it_needs():
    x = torch.randn(2)
    got, n = one_graph(islice_of_map, x)
    want, want_n = islice_of_map(x)
    assert n == want_n == 5
    same(got, want)


def short_circuit(x):
    seen = []

    def positive(n):
        seen.append(n)
        return n > 0
    return x + all(map(positive, x.shape)), any(map(lambda n: n > 2, [1, 3, 0])), \
        all(map(positive, [2, -1, 5])), seen


def test_all_any_over_a_map_stop_where_python_stops():
    x = torch.randn(2, 3)
    got, want = one_graph(short_circuit, x), short_circuit(x)
    same(got, want)
    assert got[3] == [2, 3, 2, -1]  # 5 never checked


def test_map_with_a_pure_builtin_still_gives_values():
    def fn(x):
        return x + len(", ".join(map(str, [1, 22, 333])))
    check(fn, torch.randn(2))


def test_break_inside_a_loop_over_a_map_matches_eager():
    def fn(x):
        out = x
        for y in map(lambda t: t * 2, [x, x + 1, x + 2]):
            out = out + y
            kiln.graph_break()
        return out
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


def test_break_with_a_live_map_matches_eager():
    def fn(x):
        it = map(lambda t: t * 3, [x, x + 1, x + 2])
        first = next(it)
        kiln.graph_break()
        return first + sum(it)
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


# ---------------------------------------------------------------- the other itertools
def counted(x, ys):
    out = x
    for i, y in zip(itertools.count(2), ys):
        out = out * i + y
    steps = list(zip(itertools.count(0.5, 0.25), "abc"))
    return out, steps


def test_count_zipped_with_a_list():
    check(counted, torch.randn(3), [torch.randn(3), torch.randn(3)])


def longest(x, y):
    rows = [(a, b) for a, b in itertools.zip_longest([x, y, x], [y], fillvalue=0)]
    plain = list(itertools.zip_longest([1, 2], "abc"))
    return [a + b for a, b in rows], plain


def test_zip_longest():
    check(longest, torch.randn(3), torch.randn(3))


def accumulated(x):
    running = list(itertools.accumulate([x, x * 2, x * 3]))
    products = list(itertools.accumulate([x, x + 1], lambda a, b: a * b, initial=x - 1))
    return running, products, list(itertools.accumulate([1, 2, 3]))


def test_accumulate():
    check(accumulated, torch.randn(3))


def test_islice_forms():
    def fn(x):
        xs = [x * i for i in range(6)]
        return (list(itertools.islice(xs, 3)), list(itertools.islice(xs, 2, None)),
                list(itertools.islice(xs, 0, 6, 4)), list(itertools.islice(iter(xs), 10)))
    check(fn, torch.randn(2))


# ---------------------------------------------------------------- min / max
def keyed(x):
    xs = [x, x * 2, x[:2]]
    shortest = min(xs, key=lambda t: t.shape[0])      # the first of the shortest
    longest = max(xs, key=lambda t: t.shape[0])       # the first of the longest: x itself
    word = max(["bb", "a", "ccc", "dd"], key=len)
    return shortest, longest is x, word, min([3, -7, 2], key=abs), max([], default=x)


def test_min_max_with_key_and_default():
    x = torch.randn(4)
    got = one_graph(keyed, x)
    want = keyed(x)
    same(got[0], want[0])
    assert got[1:4] == want[1:4] == (True, "ccc", 2)
    same(got[4], want[4])


def test_min_max_of_tensors_and_numbers():
    def fn(a, b):
        a, b = a.sum(), b.max()
        return max(a, b), min(a, b, 0.5), max([a, 1, b]), min(2, a)
    for scale in (1.0, 0.01, 100.0):
        a, b = torch.randn(3) * scale, torch.randn(3) * scale
        got, want = one_graph(fn, a, b), fn(a, b)
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.as_tensor(g, dtype=torch.float32),
                                       torch.as_tensor(w, dtype=torch.float32))


def test_max_of_a_many_element_tensor_raises_as_eager():
    def fn(x):
        return max(x, 0)
    with pytest.raises(RuntimeError, match="ambiguous"):
        kiln.compile(fn)(torch.randn(3))
