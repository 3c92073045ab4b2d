"""torch.vmap in captured code, unrolled over the batch (capture/vmap.py): values, layouts and
dtypes as eager's, in-place functions returning their argument (``y is x``), and clean breaks
for what is not unrolled."""
import pytest
import torch

import kiln
from testing import assert_close


def _same(fn, *inputs, strides=True):
    want = fn(*[x.clone() for x in inputs])
    assert kiln.explain(fn)(*[x.clone() for x in inputs]).graph_break_count == 0
    got = kiln.compile(fn, fullgraph=True)(*[x.clone() for x in inputs])
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride() or not strides
        assert_close(got, want)
    else:
        assert got == want
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vmap_with_in_dims_and_out_dims(dtype):
    x, w = torch.randn(3, 5, dtype=dtype), torch.randn(3, dtype=dtype)
    fn = lambda x, w: torch.vmap(lambda r, w: (r * w).sum() * r + 1, in_dims=(1, None), out_dims=1)(x, w)  # noqa: E731
    _same(fn, x, w)
    # a non-contiguous mapped input: the unrolled result is a contiguous stack, where eager's
    # batched kernels follow the input's layout (a known difference, capture/vmap.py)
    _same(lambda x: torch.vmap(torch.sin)(x.t()), x, strides=False)
    _same(lambda x: torch.func.vmap(lambda r: (r.cos(), r.sum()))(x)[1], x)


def test_in_place_functions_return_their_argument_and_write_it():
    # PyTorch's test_is_vmapped_mutated_tensor_tensor and its variants
    def one(z):
        x = z.clone()
        y = torch.vmap(torch.Tensor.acos_)(x)
        return y is x, x
    z = torch.rand(4, 1)
    got = kiln.compile(one, fullgraph=True)(z.clone())
    want = one(z.clone())
    assert got[0] is True and want[0] is True
    assert_close(got[1], want[1])

    def two(y, z):
        a, b = y.clone(), z.clone()
        c, dd = torch.vmap(lambda a, b: (a.acos_(), b.acos_()))(a, b)
        return a is c is b is dd, c is a and dd is b, a + 0
    _same(lambda y, z: two(y, z)[:2], torch.rand(4, 2), torch.rand(4, 10))
    assert_close(kiln.compile(two, fullgraph=True)(torch.rand(4, 2) * 0 + 0.5, torch.rand(4, 10))[2],
                 torch.full((4, 2), 0.5).acos())


def test_in_place_method_of_a_fallback_op_writes_self():
    x = torch.rand(6, dtype=torch.float16)
    _same(lambda x: x.clone().acos_() + x.clone().lgamma_(), x)
    e = kiln.explain(lambda x: x.clone().bernoulli_())(x)
    assert e.graph_break_count == 1  # bernoulli_'s p=0.5 is not bernoulli's p=self


def test_what_is_not_unrolled_is_a_named_break():
    x = torch.randn(100, 3)
    e = kiln.explain(lambda x: torch.vmap(torch.sin)(x))(x)
    assert e.graph_break_count == 1 and "batch size 100" in e.break_reasons[0].reason
    assert_close(kiln.compile(lambda x: torch.vmap(torch.sin)(x))(x), x.sin())
    e = kiln.explain(lambda x: torch.vmap(torch.sin, randomness="same")(x))(x[:4])
    assert e.graph_break_count == 1 and "randomness" in e.break_reasons[0].reason


def test_a_symbolic_batch_is_specialized_and_the_other_sizes_stay_symbolic():
    """dynamic=True makes the batch size a symbol; vmap unrolls over it, so it is specialized
    (guarded, one entry per batch size) while the mapped rows' own sizes stay symbolic."""
    def f(x, w):
        return torch.vmap(lambda r: (r * w).sum(-1))(x) + 1

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True, fullgraph=True)
    for b, n in [(3, 5), (3, 7), (4, 5), (4, 9)]:
        x, w = torch.randn(b, 2, n), torch.randn(n)
        got, want = compiled(x, w), f(x, w)
        assert_close(got, want)
        assert got.stride() == want.stride()
    stats = kiln.stats()
    assert stats["frames_compiled"] == 2 and stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats

    def g(x):  # Dynamo's test_is_vmapped_mutated_tensor_tensor, which asks dynamic=True
        y = torch.vmap(torch.Tensor.acos_)(x)
        return y is x, x + 0

    for n in (4, 6):
        x = torch.rand(n)
        xe = x.clone()
        got, want = kiln.compile(g, dynamic=True, fullgraph=True)(x), g(xe)
        assert got[0] == want[0]
        assert_close(got[1], want[1])
        assert_close(x, xe)  # acos_ wrote the caller's tensor, as in eager
