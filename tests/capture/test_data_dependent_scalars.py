"""Values that depend on tensor data under fullgraph=True (issue 24): PyTorch's
test_listlike_of_tensors_contains_constant, test_cast_tensor_single_elem (dynamo
test_functions.py) and test_nonzero_unbacked_refinement (inductor). Python numbers made from
computed tensors are numbers in the graph (capture/scalar_values.py); ``x.nonzero()`` is sized
by ``torch._check`` (capture/sized_later.py)."""
import pytest
import torch

import kiln
from testing import assert_close


def _same(got, want):
    """Equal values and eager's Python types, through tuples."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert_close(got, want)
    else:
        assert got == want or (got != got and want != want), (got, want)


def _no_eager_work(breaks=0):
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["graph_breaks"] == breaks, stats
    assert stats.get("eager_runs", 0) == 0, stats


# ---------------------------------------------------------------- `in` over containers of tensors
@pytest.mark.parametrize("listlike", [set, frozenset, list, tuple])
@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_listlike_of_tensors_contains_constant(listlike, backend):
    def fn(x):
        x.add_(1)
        s = listlike([x])
        return 1 in s
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for v in (torch.randn(1), torch.zeros(1), torch.tensor([-1.0]), torch.randn(1)):
        _same(compiled(v.clone()), fn(v.clone()))  # zeros(1) + 1 == 1: a list finds it
    _no_eager_work()
    assert kiln.stats()["frames_compiled"] == 1


def test_sequence_contains_follows_cpython():
    # identity first (no comparison), then bool(el == item) per element until one is true;
    # a constant match is known while tracing
    def fn(x, y):
        return (2 in (x, 2), x in [y, x], 3 in [x, y + 2], 1 not in [x], y in [x])
    compiled = kiln.compile(fn, fullgraph=True)
    for _ in range(3):
        x, y = torch.randint(0, 3, (1,)).float(), torch.randint(0, 3, (1,)).float()
        _same(compiled(x, y), fn(x, y))
    _no_eager_work()


def test_list_contains_tensor_without_fullgraph_breaks_with_a_reason():
    def fn(x):
        x.add_(1)
        return 1 in [x]
    compiled = kiln.compile(fn)
    for v in (torch.zeros(1), torch.randn(1)):
        _same(compiled(v.clone()), fn(v.clone()))
    e = kiln.explain(fn)(torch.zeros(1))
    assert e.graph_break_count == 1
    assert "data-dependent" in e.break_reasons[0].reason and "`in`" in e.break_reasons[0].reason


def test_list_contains_a_many_element_tensor_is_refused_as_eager_refuses():
    fn = lambda x: 1 in [x]  # noqa: E731 - eager: "Boolean value of Tensor ... is ambiguous"
    with pytest.raises(RuntimeError, match="ambiguous"):
        fn(torch.ones(2))
    with pytest.raises(RuntimeError, match="ambiguous") as got:  # eager's own error
        kiln.compile(fn, fullgraph=True)(torch.ones(2))
    assert not isinstance(got.value, kiln.GraphBreakError)


# ---------------------------------------------------------------- float(t), int(t), bool(t), t.item()
CASTS = [(float, 1.0), (float, 1), (float, True), (int, 1), (int, False), (bool, 1.0), (bool, 0),
         (bool, False)]


@pytest.mark.parametrize("cast,val", CASTS, ids=[f"{c.__name__}-{v!r}" for c, v in CASTS])
@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_cast_tensor_single_elem(cast, val, backend):
    def fn(x):
        x = x + 1
        return cast(x)
    compiled = kiln.compile(fn, backend=backend, fullgraph=True, dynamic=False)
    for v in (val, (not val) if type(val) is bool else -2 * val, val):  # fresh inputs, same dtype
        x = torch.tensor([v])
        _same(compiled(x), fn(x))
    _no_eager_work()
    assert kiln.stats()["frames_compiled"] == 1  # the value is not guarded
    with pytest.raises((ValueError, RuntimeError)) as want:
        fn(torch.tensor([val] * 2))
    with pytest.raises(type(want.value), match="one element|more than one value") as got:
        compiled(torch.tensor([val] * 2))  # eager's own error (errors.EagerRaises), not a break
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_numbers_compute_as_python_numbers(backend):
    def fn(x, n):
        f, i, b = float(x.sum()), int(n.sum()), bool(n.sum())
        return (f * 2 + 1, i / 3, i // 3, i % 3, -i, i ** 2, b + b, -b, ~b, f > 0.5, b & True,
                x * f, x[0] * f, n * i, n.half() * f, x.sum().item(), (x > 0).sum().item(),
                (x > 0).any().item())
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(3):
        x, n = torch.randn(3), torch.randint(0, 6, (2,))
        _same(compiled(x, n), fn(x, n))
    _no_eager_work()
    assert kiln.stats()["frames_compiled"] == 1


def test_a_number_with_a_gradient_input_returns_a_float_and_keeps_the_grad_path():
    def fn(w):
        y = (w * 2).sum()
        return y, float(y)
    w = torch.randn(3, requires_grad=True)
    (got, got_f), (want, want_f) = kiln.compile(fn, fullgraph=True)(w), fn(w)
    assert type(got_f) is float and got_f == want_f
    got.backward()
    assert_close(w.grad, torch.full((3,), 2.0))


def test_branching_on_a_number_or_using_it_as_a_size_is_a_clear_error():
    branch = lambda x: x if float(x.sum()) > 0 else -x  # noqa: E731
    size = lambda x: x.new_ones(int(x.long().sum()))  # noqa: E731
    with pytest.raises(kiln.GraphBreakError, match="data-dependent branch.*float"):
        kiln.compile(branch, fullgraph=True)(torch.randn(3))
    with pytest.raises(kiln.GraphBreakError, match="data-dependent argument of Tensor.new_ones"):
        kiln.compile(size, fullgraph=True)(torch.ones(3))
    with pytest.raises(kiln.GraphBreakError, match="int\\(\\) of a floating value"):
        kiln.compile(lambda x: int(x + 1), fullgraph=True)(torch.ones(1))


def test_without_fullgraph_a_cast_stays_a_break():
    fn = lambda x: float(x + 1)  # noqa: E731
    x = torch.ones(1)
    _same(kiln.compile(fn)(x), fn(x))
    e = kiln.explain(fn)(x)
    assert e.graph_break_count == 1 and "float() of a tensor reads its data" in e.break_reasons[0].reason


# ---------------------------------------------------------------- nonzero sized by torch._check
def _nonzero_checked(x):
    z = x.nonzero()
    torch._check(z.size(0) == 4)
    return z + 3


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_nonzero_unbacked_refinement(backend):
    compiled = kiln.compile(_nonzero_checked, backend=backend, fullgraph=True)
    x = torch.tensor([0, 1, 3, 4, 2, 0, 0])
    _same(compiled(x), _nonzero_checked(x))
    for fresh in ([5, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 2, 2, 2, 2, 0, 0, 0]):
        x = torch.tensor(fresh)
        _same(compiled(x), _nonzero_checked(x))
    _no_eager_work()
    assert kiln.stats()["frames_compiled"] == 2  # static, then x's size symbolic: the count is no guard
    with pytest.raises(RuntimeError):
        _nonzero_checked(torch.tensor([0, 0, 0, 0]))
    with pytest.raises(RuntimeError) as raised:
        compiled(torch.tensor([0, 0, 0, 0]))
    # backend="eager"'s graph.run names the node and chains the op's own error
    assert "Expected cond to be True" in str(raised.value) + str(raised.value.__cause__)


def test_nonzero_checked_through_shape_and_torch_function():
    def fn(x):
        z = torch.nonzero(x)
        torch._check(2 == z.shape[0])
        return z * 2, z.shape, z.size(1)
    compiled = kiln.compile(fn, fullgraph=True)
    for v in ([[0, 1], [1, 0]], [[0, 0], [3, 3]]):
        x = torch.tensor(v)
        _same(compiled(x), fn(x))
    _no_eager_work()


def test_nonzero_used_before_a_check_names_the_missing_check():
    def used(x):
        return x.nonzero() + 3

    def branched(x):
        z = x.nonzero()
        return z if z.size(0) == 4 else x
    for fn in (used, branched):
        with pytest.raises(kiln.GraphBreakError, match="data-dependent shape.*torch._check"):
            kiln.compile(fn, fullgraph=True)(torch.tensor([0, 1, 3, 4, 2]))
    x = torch.tensor([0, 1, 3, 4, 2])
    _same(kiln.compile(used)(x), used(x))  # without fullgraph: a break, eager's answer
    assert kiln.explain(used)(x).graph_break_count == 1
