"""itertools.chain / product / combinations / permutations and map with a pure builtin compile
(PyTorch's test_functions test_itertools_chain, _combinations, _product ran their frames
eagerly: "creating a chain object is not supported"). The combinatorics run on positions, so
tensors are regrouped, never compared; each case matches eager with fullgraph=True."""
import itertools

import torch

import kiln


def chain(a, b):
    v = a
    for x in itertools.chain([a, b], [1, 2], (b * 2,)):
        v = v + x
    return v


def regroup(a, b):
    out = [torch.ones(size) for size in itertools.combinations((1, 2, 3, 4), 2)]
    out += [p * q for p, q in itertools.product([a, b], (1, 2))]
    out += [p - q for p, q in itertools.permutations([a, b, a * 3], 2)]
    out += [p[0] + p[1] for p in itertools.product([a, b], repeat=2)]
    return out


def mapped(a):
    return list(map(str, [1, 2])), list(map(abs, [-1, 2.5])), a + len(list(map(int, "123")))


def test_itertools_match_eager():
    for fn in (chain, regroup):
        compiled = kiln.compile(fn, fullgraph=True)
        for _ in range(2):
            a, b = torch.randn(4, 4), torch.randn(4, 4)
            got, want = compiled(a, b), fn(a, b)
            got, want = (got, want) if isinstance(want, list) else ([got], [want])
            assert len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)


def test_map_with_a_pure_builtin():
    a = torch.randn(3)
    got, want = kiln.compile(mapped, fullgraph=True)(a), mapped(a)
    assert got[:2] == want[:2]
    torch.testing.assert_close(got[2], want[2])


def test_map_with_a_user_function():  # traced per item (test_itertools_map.py)
    def fn(a):
        return list(map(lambda t: t * 2, [a, a + 1]))[1]
    a = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn, fullgraph=True)(a), fn(a))
