"""torch.ops.aten.* calls in captured code: the overload is bound from the arguments (a packet)
or given (an OpOverload), then routed to the torch-level capture rule of the same name, or run
as a fallback node; mutating and view-returning ops stay graph breaks. Random ops draw as
their torch function does (kiln's RNG for a capture-table entry, torch's for a fallback node,
which CSE never merges)."""
import pytest
import torch

import kiln
from testing import assert_close

aten = torch.ops.aten


def _one_graph(fn, *args):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    return e


def test_packets_pick_their_overload_from_the_arguments():
    def fn(x, y):
        a = aten.add(x, y)              # add.Tensor
        b = aten.add(a, 2)              # add.Scalar (a number for `other`)
        c = aten.mul(b, y, )            # mul.Tensor
        d = aten.leaky_relu(c, 0.2)     # F.leaky_relu
        return aten.sum(d, [1]), aten.div(d, 3.0), aten.argmax(d, 1)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    _one_graph(fn, x, y)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x, y), fn(x, y)):
        assert_close(got, want)


def test_explicit_overloads_and_their_keywords():
    def fn(x):
        a = aten.mul.Tensor(x, 2)
        b = aten.add.Tensor(a, x, alpha=3)
        c = aten.arange.start_step(0, 20, 4, dtype=torch.int64, device=x.device)
        d = aten.constant_pad_nd.default(b, [1, 1])
        return d, c + x[:5].sum(), aten.avg_pool2d.default(b.reshape(1, 1, 4, 5), [2, 2])
    x = torch.randn(4, 5)
    _one_graph(fn, x)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(got, want)


def test_an_op_without_a_capture_rule_is_a_fallback_node():
    def fn(x):
        return aten._softmax.default(x, 1, False) + aten.logcumsumexp(x, 0)
    x = torch.randn(4, 5)
    e = _one_graph(fn, x)
    assert "torch.ops.aten._softmax.default" in e.graphs[0].python()
    assert_close(kiln.compile(fn, fullgraph=True)(x), fn(x))


def test_gradients_flow_through_routed_aten_calls():
    def fn(x, w):
        return aten.mul.Tensor(aten.tanh(x), w).sum()
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    kiln.compile(fn, fullgraph=True)(x, w).backward()
    gx, gw = x.grad, w.grad
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    fn(x2, w2).backward()
    assert_close(gx, x2.grad)
    assert_close(gw, w2.grad)


def test_in_place_aten_ops_write_the_input():
    def fn(x):
        aten.add_.Tensor(x, 1)
        return x * 2
    x = torch.randn(3)
    x_ref = x.clone()
    _one_graph(fn, x.clone())
    assert_close(kiln.compile(fn, fullgraph=True)(x), fn(x_ref))
    assert_close(x, x_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_random_aten_ops_compile_and_two_draws_differ(dtype):
    """PyTorch's test_bernoulli2: aten.bernoulli(a) has eager's mean; two equal random calls
    are two draws (a fallback node is never merged by CSE), and bernoulli_'s default p=0.5
    is not bernoulli(self)'s p=self."""
    a = torch.full((200, 200), 0.3, dtype=dtype)
    fns = {
        "bernoulli": (lambda a: aten.bernoulli(a).float().mean(), 0.3),
        "rand_like": (lambda a: aten.rand_like(a).float().mean(), 0.5),
        "uniform_": (lambda a: aten.uniform_(a.clone(), 2, 3).float().mean(), 2.5),
    }
    for name, (fn, mean) in fns.items():
        assert kiln.explain(fn)(a).graph_break_count == 0, name
        got = kiln.compile(fn, fullgraph=True)(a)
        assert got.dtype == fn(a).dtype
        assert abs(got.item() - mean) < 0.02, name
    for op in (torch.bernoulli, torch.poisson, aten.bernoulli):
        two = lambda a: (op(a) - op(a)).abs().sum()  # noqa: E731
        assert kiln.compile(two)(a.float()).item() > 1000, op
    same_p = lambda a: aten.bernoulli_(a.clone()).mean()  # noqa: E731  (p=0.5, not a's 0.3)
    got = kiln.compile(same_p)(a.float())
    assert abs(got.item() - 0.5) < 0.02


def test_a_torch_function_with_another_signature_is_not_used():
    # F.elu(input, alpha, inplace) against aten::elu(self, alpha, scale, input_scale)
    def fn(x):
        return aten.elu(x, 1.67, 1.05) + 2, aten.elu(x + 1, 2, 3, 4)
    x = torch.randn(8, 8)
    _one_graph(fn, x)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(got, want)


def test_prims_keep_their_own_semantics():
    def fn(a, b):
        return torch.ops.prims.div(a, b)  # truncating on integers, unlike torch.div
    a, b = torch.randint(-20, 20, (10,)), torch.randint(1, 5, (10,))
    got, want = kiln.compile(fn, fullgraph=True)(a, b), fn(a, b)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_views_from_aten_calls_alias_their_base():
    def fn(x):
        v = aten.view(x, [20])
        v.add_(1)  # through a routed view: reaches x
        s = aten.slice.Tensor(x, 1, 1, 3)
        return s * 2, x + 0
    x = torch.randn(4, 5)
    x_ref = x.clone()
    got, want = kiln.compile(fn, fullgraph=True)(x), fn(x_ref)
    for g, w in zip(got, want):
        assert_close(g, w)
    assert_close(x, x_ref)


def test_dtypes_and_layouts_given_as_their_enum_ints():
    def fn(a):
        return (aten.new_ones(a, [2], device=a.device, dtype=6, layout=0, pin_memory=False),
                aten._to_copy(a + 1, dtype=4))
    a = torch.randn(8)
    _one_graph(fn, a)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(a), fn(a)):
        assert got.dtype == want.dtype
        assert_close(got, want)


def test_pool_sizes_as_one_element_lists():
    def fn(x):
        return aten.avg_pool2d(x, [3], [2], [1]), torch.nn.functional.max_pool2d(x, [2])
    x = torch.randn(1, 2, 8, 8)
    _one_graph(fn, x)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(got, want)


def test_aliases_and_in_place_methods_keep_gradients_and_writes():
    def fn(x, idx, v):
        a = aten.slice.Tensor(x, 1, 1, 9223372036854775807)  # aten's "to the end"
        b = aten.constant_pad_nd.default(a, [1, 2], 0.5)
        y = x.detach().clone()
        aten.index_put_(y, [idx], v)
        return b.sum(), y
    x = torch.randn(4, 5, requires_grad=True)
    idx, v = torch.tensor([0, 2]), torch.randn(2, 5)
    _one_graph(fn, x, idx, v)
    got = kiln.compile(fn, fullgraph=True)(x, idx, v)
    got[0].backward()
    g = x.grad
    x2 = x.detach().clone().requires_grad_()
    want = fn(x2, idx, v)
    want[0].backward()
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])
    assert_close(g, x2.grad)
