"""``collections.deque`` in captured code (capture/values_deque.py): made in the frame or passed
in, its methods (append/appendleft, extend/extendleft, pop/popleft, rotate, insert, remove,
indexing, item writes, maxlen, iteration, len) run in the trace; an input deque's writes reach
the caller's object, and a returned deque is a real deque (the caller's own where it was an
input). Each case is compared with eager, in one graph with no break (PyTorch's
test_functions test_deque broke 27 times)."""
import collections

import pytest
import torch

import kiln


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    return out.result


def peer_deque(a, b):  # PyTorch's test_functions test_deque
    f = collections.deque([a, b])
    f.append(a + 1)
    f.extend([a, b])
    f.insert(0, "foo")
    tmp = f.pop()
    another_deque = collections.deque([tmp])
    f.extendleft(another_deque)
    another_deque.clear()
    f.extend(another_deque)
    f[2] = "setitem"
    f = f.copy()
    f.append(f.popleft())
    empty = collections.deque()
    f.extend(empty)
    return list(f)


def test_peer_deque_case():
    a, b = torch.randn(3), torch.randn(3)
    got, want = one_graph(peer_deque, a, b), peer_deque(a, b)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def bounded(x):
    d = collections.deque(maxlen=3)
    for i in range(5):
        d.append(x + i)      # a full deque drops from the left
    d.appendleft(x * 10)     # ... and from the right
    d.rotate(1)
    d.rotate(-2)
    total = sum(d)
    first = d[0] + d[-1]
    return total + first + len(d) + d.maxlen, d


def test_maxlen_rotate_indexing_and_returned_as_a_deque():
    x = torch.randn(3)
    got, d = one_graph(bounded, x)
    want, want_d = bounded(x)
    torch.testing.assert_close(got, want)
    assert type(d) is collections.deque and d.maxlen == 3
    assert len(d) == len(want_d)
    for g, w in zip(d, want_d):
        torch.testing.assert_close(g, w)


def popping(x):
    d = collections.deque([x, x + 1, x + 2, x + 3], 3)  # keeps the last three
    out = d.pop() * d.popleft()
    d.extendleft([x * 2, x * 3])  # reversed onto the left
    for y in d:
        out = out + y
    ints = collections.deque([3, 1, 4, 1, 5])
    ints.remove(1)
    ints.reverse()
    return out, list(reversed(d)), list(ints), ints.index(1), ints.count(5), 4 in ints


def test_pop_popleft_extendleft_iteration_remove_index_count():
    x = torch.randn(4)
    got = one_graph(popping, x)
    want = popping(x)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[2:] == want[2:]
    assert got[2] == [5, 1, 4, 3]


def mutate_input(x, d):
    d.append(x + 1)
    first = d.popleft()
    d.appendleft(first * 2)
    return d[0] + d[-1]


def test_input_deque_is_written_back():
    x = torch.randn(3)
    d, want_d = collections.deque([torch.ones(3), x]), collections.deque([torch.ones(3), x])
    kiln.reset()
    out = kiln.explain(mutate_input, backend="eager")(x, d)
    assert out.graph_break_count == 0, out.break_reasons
    want = mutate_input(x, want_d)
    torch.testing.assert_close(out.result, want)
    compiled = kiln.compile(mutate_input)
    for _ in range(2):  # the second call runs the cached graph: its writes are replayed
        d, want_d = collections.deque([torch.ones(3), x]), collections.deque([torch.ones(3), x])
        torch.testing.assert_close(compiled(x, d), mutate_input(x, want_d))
        assert type(d) is collections.deque and len(d) == len(want_d) == 3
        for g, w in zip(d, want_d):
            torch.testing.assert_close(g, w)


def returns_input(x, d):
    d.append(x * 2)
    return d


def test_returned_input_deque_is_the_callers_own():
    x = torch.randn(3)
    compiled = kiln.compile(returns_input)
    for _ in range(2):
        d = collections.deque([x], maxlen=2)
        out = compiled(x, d)
        assert out is d and d.maxlen == 2 and len(d) == 2
        torch.testing.assert_close(d[1], x * 2)


def test_input_deque_guarded_by_length_and_maxlen():
    def fn(x, d):
        return x + len(d) + (d.maxlen or 0)
    compiled = kiln.compile(fn)
    x = torch.zeros(2)
    for d in (collections.deque([1, 2]), collections.deque([1, 2, 3]), collections.deque([1], 5)):
        torch.testing.assert_close(compiled(x, d), fn(x, d))


def test_break_with_a_live_deque_resumes():
    def fn(x):
        d = collections.deque([x + 1], maxlen=4)
        d.append(x * 2)
        kiln.graph_break()
        d.appendleft(x - 1)
        return sum(d), d
    x = torch.randn(3)
    got, d = kiln.compile(fn)(x)
    want, want_d = fn(x)
    torch.testing.assert_close(got, want)
    assert type(d) is collections.deque and d.maxlen == 4 and len(d) == 3


def test_pop_of_an_empty_deque_raises_as_eager():
    def fn(x):
        d = collections.deque()
        return x + d.pop()
    with pytest.raises(IndexError):
        kiln.compile(fn)(torch.randn(2))
