"""``sorted(..., key=...)`` compiles (PyTorch's test_functions test_list_sorted2): the key
function is traced per item and must give Python constants; it used to be an internal error
(``_sorted() got an unexpected keyword argument 'key'``) that ran the frame eagerly."""
import torch

import kiln


def test_sorted_with_key_matches_eager():
    def fn(x):
        y = [("john", "A", 8), ("jane", "B", 5), ("dave", "B", 10)]
        return (x + 1, sorted(y), sorted(y, key=lambda s: s[2]),
                sorted(y, key=lambda s: s[2], reverse=True), sorted(["bb", "a", "ccc"], key=len),
                sorted([3, 1, 2], key=None), x * sorted([2, 5, 1], key=lambda v: -v)[0])
    compiled = kiln.compile(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        got, want = compiled(x), fn(x)
        assert got[1:6] == want[1:6]
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[6], want[6])
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_runs"] == 0


def test_a_key_giving_tensors_is_a_break():
    def fn(x):
        return sorted([x, x + 1], key=lambda t: t.sum())[0] * 2
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
    assert kiln.stats()["fallbacks"] == 0
