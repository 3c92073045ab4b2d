"""torch.library custom ops inside kiln's graph (issue 27): a ``custom_op`` function, its
``torch.ops`` packet/overload and a ``Library.define`` op are one opaque node (meta from the fake
implementation, run by the wrapper between kiln's kernels), with symbolic sizes where the fake
implementation allows, and torch's registered autograd formula in the backward. What kiln cannot
keep (no fake impl, a mutating op, a gradient with no formula) is a graph break with a reason."""
import warnings

import pytest
import torch

import kiln
from tests.testing import assert_close

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ------------------------------------------------------------------ the ops under test
@torch.library.custom_op("kiln_test::mysin", mutates_args=())
def mysin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


@mysin.register_fake
def _(x):
    return torch.empty_like(x)


def _mysin_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _mysin_backward(ctx, g):
    (x,) = ctx.saved_tensors
    return g * x.cos()


mysin.register_autograd(_mysin_backward, setup_context=_mysin_setup)


@torch.library.custom_op("kiln_test::scaled_mul", mutates_args=())
def scaled_mul(x: torch.Tensor, y: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return (x * y * alpha).contiguous()


@scaled_mul.register_fake
def _(x, y, *, alpha):
    return torch.empty(torch.broadcast_shapes(x.shape, y.shape), dtype=x.dtype, device=x.device)


def _sm_setup(ctx, inputs, keyword_only_inputs, output):
    ctx.save_for_backward(*inputs)
    ctx.alpha = keyword_only_inputs["alpha"]


def _sm_backward(ctx, g):
    x, y = ctx.saved_tensors
    return g * y * ctx.alpha, g * x * ctx.alpha


torch.library.register_autograd("kiln_test::scaled_mul", _sm_backward, setup_context=_sm_setup)


@torch.library.custom_op("kiln_test::doubled_cols", mutates_args=())
def doubled_cols(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, 2 * x], dim=-1)


@doubled_cols.register_fake
def _(x):
    return x.new_empty(*x.shape[:-1], 2 * x.shape[-1])


@torch.library.custom_op("kiln_test::split_stats", mutates_args=())
def split_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.amax(dim=-1), x.exp()


@split_stats.register_fake
def _(x):
    return x.new_empty(x.shape[:-1]), torch.empty_like(x)


@torch.library.custom_op("kiln_test::nograd", mutates_args=())
def nograd(x: torch.Tensor) -> torch.Tensor:
    return x.tanh()


@nograd.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("kiln_test::nofake", mutates_args=())
def nofake(x: torch.Tensor) -> torch.Tensor:
    return x.tanh()


@torch.library.custom_op("kiln_test::add_into", mutates_args=("out",))
def add_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.add_(x)


@add_into.register_fake
def _(x, out):
    return None


@torch.library.custom_op("kiln_test::liar", mutates_args=())
def liar(x: torch.Tensor) -> torch.Tensor:
    return x[:-1].clone()


@liar.register_fake
def _(x):
    return torch.empty_like(x)  # wrong: the real op drops a row


_LIB = torch.library.Library("kiln_test_def", "DEF")
_LIB.define("shift(Tensor x, float by) -> Tensor")
_LIB.impl("shift", lambda x, by: x + by, "CompositeExplicitAutograd")


@torch.library.register_fake("kiln_test_def::shift")
def _(x, by):
    return torch.empty_like(x)


_LIB2 = torch.library.Library("kiln_test_def2", "DEF")
_LIB2.define("cube(Tensor x) -> Tensor")
_LIB2.impl("cube", lambda x: x * x * x, "CompositeExplicitAutograd")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # impl_abstract: register_fake's old name
    torch.library.impl_abstract("kiln_test_def2::cube", lambda x: torch.empty_like(x), lib=_LIB2)
torch.library.register_autograd(
    "kiln_test_def2::cube", lambda ctx, g: g * 3 * ctx.saved_tensors[0] ** 2,
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]), lib=_LIB2)


# ------------------------------------------------------------------ helpers
def _one_graph(fn, *args, kernels=2, externs=1):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    (c,) = e.compiles
    assert c.extern_calls >= externs, c
    assert len(c.kernels) >= kernels, c  # kiln's own kernels on each side of the library call
    return c


def _check(fn, make, calls=3, **compile_kw):
    compiled = kiln.compile(fn, fullgraph=True, **compile_kw)
    for _ in range(calls):  # fresh inputs every call, compared with eager
        args = make()
        got, want = compiled(*args), fn(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert_close(g, w)


def _between(x):
    y = x * 2 + 1            # a kiln kernel before the op
    z = mysin(y)             # the opaque node
    return z.cos() + y       # a kiln kernel after it


# ------------------------------------------------------------------ forward
@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_between_fused_pointwise_ops_is_one_graph(device):
    x = torch.randn(8, 16, device=device)
    c = _one_graph(_between, x)
    assert "custom_op" in c.graph.python() and "kiln_test.mysin" in c.graph.python()
    assert_close(c.graph.as_function()(x)[0], _between(x))  # the printed graph runs
    _check(_between, lambda: (torch.randn(8, 16, device=device),))


@pytest.mark.parametrize("spelling", ["packet", "overload"])
def test_torch_ops_spellings_of_a_custom_op(spelling):
    op = torch.ops.kiln_test.mysin if spelling == "packet" else torch.ops.kiln_test.mysin.default

    def fn(x):
        return op(x.exp()).neg() * 3
    _one_graph(fn, torch.randn(5, 3))
    _check(fn, lambda: (torch.randn(5, 3),))


def test_library_define_op_with_register_fake():
    def fn(x):
        return torch.ops.kiln_test_def.shift(x.abs(), 0.5).sqrt() - 1
    _one_graph(fn, torch.randn(6, 7))
    _check(fn, lambda: (torch.randn(6, 7),))


def test_keyword_only_argument_and_broadcasting_fake():
    def fn(x, y):
        return scaled_mul(x + 1, y, alpha=0.25).sum(-1)
    _one_graph(fn, torch.randn(4, 5), torch.randn(5), kernels=1)
    _check(fn, lambda: (torch.randn(4, 5), torch.randn(5)))


def test_several_results():
    def fn(x):
        m, e = split_stats(x * 3)
        return m + 1, e.sum(-1)
    _one_graph(fn, torch.randn(3, 8))
    _check(fn, lambda: (torch.randn(3, 8),))


def test_fp16_input():
    def fn(x):
        return mysin(x * 2).to(torch.float32) + 1
    x = torch.randn(4, 32).half()
    _one_graph(fn, x)
    _check(fn, lambda: (torch.randn(4, 32).half(),))


def test_non_contiguous_inputs_and_intermediates():
    def fn(x):
        t = x.t()                       # a transposed view into the op
        return mysin(t) + doubled_cols(t)[:, : t.shape[1]] + mysin(x * 2).t()
    make = lambda: (torch.randn(6, 5),)  # noqa: E731
    e = kiln.explain(fn)(*make())
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    _check(fn, make)
    _check(fn, lambda: (torch.randn(10, 6)[::2],))  # a strided graph input


def test_under_no_grad_no_break():
    def fn(x):
        with torch.no_grad():
            return nograd(x * 2) + 1
    x = torch.randn(4, 4, requires_grad=True)
    _one_graph(fn, x, kernels=1)
    _check(fn, lambda: (torch.randn(4, 4, requires_grad=True),))


@torch.library.custom_op("kiln_test::mm_inside", mutates_args=())
def mm_inside(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ y).float()


@mm_inside.register_fake
def _(x, y):
    return x.new_empty(x.shape[0], y.shape[1], dtype=torch.float32)


def test_under_autocast_is_a_break_and_matches_eager():
    """Eager runs a custom op's implementation with autocast on (its matmul casts); kiln runs
    compiled code with autocast off, so the op is a break there, not a silently fp32 matmul."""
    def fn(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return mm_inside(x + 1, y)
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    e = kiln.explain(fn)(x, y)
    assert any("autocast" in b.reason and "kiln_test.mm_inside" in b.reason for b in e.break_reasons)
    assert torch.equal(kiln.compile(fn)(x, y), fn(x, y))


# ------------------------------------------------------------------ dynamic shapes
def test_dynamic_shapes_one_compile():
    def fn(x):
        return doubled_cols(x.sin()).cos() * 2
    kiln.reset()
    compiled = kiln.compile(fn, fullgraph=True, dynamic=True)
    before = kiln.stats()["graphs_compiled"]
    for n, m in [(3, 5), (4, 7), (9, 2), (6, 11)]:
        x = torch.randn(n, m)
        assert_close(compiled(x), fn(x))
    assert kiln.stats()["graphs_compiled"] - before == 1


def test_dynamic_shapes_several_results_and_reduced_dim():
    def fn(x):
        m, e = split_stats(x + 1)
        return m * 2, e
    kiln.reset()
    compiled = kiln.compile(fn, fullgraph=True, dynamic=True)
    before = kiln.stats()["graphs_compiled"]
    for n in (3, 5, 8):
        x = torch.randn(n, n + 2)
        for g, w in zip(compiled(x), fn(x)):
            assert_close(g, w)
    assert kiln.stats()["graphs_compiled"] - before == 1


@torch.library.custom_op("kiln_test::halve", mutates_args=())
def halve(x: torch.Tensor) -> torch.Tensor:
    return x[: x.shape[0] // 2] * 2


@halve.register_fake
def _(x):
    return x.new_empty(x.shape[0] // 2, *x.shape[1:])


@torch.library.custom_op("kiln_test::branchy", mutates_args=())
def branchy(x: torch.Tensor) -> torch.Tensor:
    return x[:50].clone() if x.shape[0] > 60 else x * 2


@branchy.register_fake
def _(x):
    return x.new_empty(50) if x.shape[0] > 60 else torch.empty_like(x)


def test_dynamic_size_the_fit_cannot_express_is_specialized():
    """``n // 2`` is no ``a * e + b`` of an input size: the sizes are specialized (a guard),
    so another size recompiles and stays right."""
    def fn(x):
        return halve(x + 1).sum(-1)
    compiled = kiln.compile(fn, fullgraph=True, dynamic=True)
    for n in (6, 9, 14):
        x = torch.randn(n, 3)
        assert_close(compiled(x), fn(x))


def test_a_fit_the_fake_impl_breaks_at_run_time_is_an_error_not_a_wrong_answer():
    """A fake impl that branches on a size no probe reached: the fitted size is checked at run
    time, and the mismatch raises naming the op (never kernels over a wrong shape)."""
    def fn(x):
        return branchy(x.cos()) + 1
    compiled = kiln.compile(fn, fullgraph=True, dynamic=True)
    x = torch.randn(4)
    assert_close(compiled(x), fn(x))
    with pytest.raises(RuntimeError, match="kiln_test.branchy"):
        compiled(torch.randn(100))


def test_a_fake_impl_that_lies_is_an_error_naming_the_op():
    def fn(x):
        return liar(x + 1) * 2
    with pytest.raises(RuntimeError, match="kiln_test.liar"):
        kiln.compile(fn)(torch.randn(4, 3))


# ------------------------------------------------------------------ autograd
def _grads(fn, *inputs):
    out = fn(*inputs)
    (out if isinstance(out, torch.Tensor) else sum(o.sum() for o in out)).sum().backward()
    return [t.grad for t in inputs]


def _compare_training(fn, make):
    compiled = kiln.compile(fn, fullgraph=True)
    for _ in range(2):
        inputs = make()
        copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        got, want = _grads(compiled, *inputs), _grads(fn, *copies)
        for g, w in zip(got, want):
            assert_close(g, w)


@pytest.mark.parametrize("device", DEVICES)
def test_register_autograd_gradients_match_eager(device):
    make = lambda: (torch.randn(6, 8, device=device, requires_grad=True),)  # noqa: E731
    _compare_training(_between, make)


def test_register_autograd_with_keyword_context_and_two_inputs():
    def fn(x, w):
        return (scaled_mul(x.tanh(), w, alpha=1.5) * x).sum(-1)
    _compare_training(fn, lambda: (torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)))


def test_only_some_inputs_need_a_gradient():
    def fn(x, w):
        return scaled_mul(x, w * 2, alpha=3.0).exp()
    _compare_training(fn, lambda: (torch.randn(3, 4), torch.randn(3, 4, requires_grad=True)))


@torch.library.custom_op("kiln_test::rand_drop", mutates_args=())
def rand_drop(x: torch.Tensor) -> torch.Tensor:
    return x * (torch.rand_like(x) > 0.5).to(x.dtype) * 2


@rand_drop.register_fake
def _(x):
    return torch.empty_like(x)


rand_drop.register_autograd(lambda ctx, g: g * (ctx.saved_tensors[0] != 0).to(g.dtype) * 2,
                            setup_context=lambda ctx, inputs, output: ctx.save_for_backward(output))


def test_formula_sees_the_forward_outputs_not_a_second_draw():
    """setup_context gets the forward's own output: a custom op that draws random numbers is
    not run again for its backward (a second draw would be a silently wrong gradient)."""
    def fn(x):
        return rand_drop(x.exp()) * x
    compiled = kiln.compile(fn, fullgraph=True)
    for seed in (0, 1):
        x = torch.randn(64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        torch.manual_seed(seed)
        out = compiled(x)
        out.sum().backward()
        torch.manual_seed(seed)
        want = fn(x2)
        want.sum().backward()
        assert_close(out, want)
        assert_close(x.grad, x2.grad)


@torch.library.custom_op("kiln_test::two", mutates_args=())
def two(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * y, x + y


@two.register_fake
def _(x, y):
    return torch.empty_like(x), torch.empty_like(x)


def _two_backward(ctx, ga, gb):
    x, y = ctx.saved_tensors
    return ga * y + gb, ga * x + gb


two.register_autograd(_two_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


@torch.library.custom_op("kiln_test::list_sum", mutates_args=())
def list_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    return xs[0] + 2 * xs[1]


@list_sum.register_fake
def _(xs):
    return torch.empty_like(xs[0])


list_sum.register_autograd(lambda ctx, g: [g, 2 * g], setup_context=lambda ctx, inputs, output: None)

_LIB.define("wsum(Tensor[] xs, Tensor w) -> Tensor")
_LIB.impl("wsum", lambda xs, w: xs[0] * w + xs[1].sin(), "CompositeImplicitAutograd")


def test_several_results_one_without_a_gradient():
    def fn(x, y):
        a, b = two(x.sin(), y)
        return a.sum()  # b gets no gradient: the formula sees zeros for it, as in eager
    make = lambda: (torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True))  # noqa: E731
    _compare_training(fn, make)
    _compare_training(lambda x, y: (lambda a, b: (a * b).sum())(*two(x, y * 2)), make)


def test_tensor_list_arguments_get_their_gradients():
    make = lambda: tuple(torch.randn(4, requires_grad=True) for _ in range(3))  # noqa: E731
    _compare_training(lambda a, b, w: list_sum([a.exp(), b * w]).sum(), make)
    # a CompositeImplicitAutograd Library op: torch's autograd of it, replayed in the backward
    _compare_training(lambda a, b, w: torch.ops.kiln_test_def.wsum([a.exp(), b], w).sum(), make)


def test_two_calls_of_a_random_op_are_not_merged():
    def fn(x):
        return rand_drop(x), rand_drop(x)
    x = torch.randn(256)
    torch.manual_seed(3)
    a, b = kiln.compile(fn, fullgraph=True)(x)
    torch.manual_seed(3)
    want_a, want_b = fn(x)
    assert not torch.equal(a, b)  # two draws, as in eager
    assert_close(a, want_a)
    assert_close(b, want_b)


def test_library_define_op_with_impl_abstract_and_register_autograd():
    def fn(x):
        return torch.ops.kiln_test_def2.cube(x * 0.5).sin()
    _one_graph(fn, torch.randn(4, 3))
    _compare_training(fn, lambda: (torch.randn(4, 3, requires_grad=True),))


def test_library_op_without_autograd_trains_as_eager():
    """No Autograd kernel: eager backprops through the Python impl (with torch's warning); kiln
    breaks there and lets eager do exactly that."""
    def fn(x):
        return torch.ops.kiln_test_def.shift(x * 2, 1.0).exp()
    x = torch.randn(5, requires_grad=True)
    e = kiln.explain(fn)(x)
    assert "no autograd formula" in e.break_reasons[0].reason, e.break_reasons
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        inputs = (torch.randn(5, requires_grad=True),)
        copies = [t.detach().clone().requires_grad_() for t in inputs]
        for g, w in zip(_grads(kiln.compile(fn), *inputs), _grads(fn, *copies)):
            assert_close(g, w)


def test_no_autograd_formula_raises_as_eager_does():
    def fn(x):
        return nograd(x * 2).sum()
    x = torch.randn(5, requires_grad=True)
    e = kiln.explain(fn)(x)
    assert e.graph_break_count >= 1
    assert "no autograd formula" in e.break_reasons[0].reason, e.break_reasons
    with pytest.raises(kiln.GraphBreakError, match="register_autograd"):
        kiln.compile(fn, fullgraph=True)(x)
    out = kiln.compile(fn)(x)  # eager runs the op: its backward raises, as eager's does
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        out.backward()
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        fn(x).backward()


# ------------------------------------------------------------------ what stays a break
def test_no_fake_impl_is_a_break_with_the_reason():
    def fn(x):
        return nofake(x + 1) * 2
    x = torch.randn(4)
    e = kiln.explain(fn)(x)
    assert e.graph_break_count == 1, e.break_reasons
    reason = e.break_reasons[0].reason
    assert "kiln_test.nofake" in reason and "register_fake" in reason, reason
    assert_close(kiln.compile(fn)(x), fn(x))


@torch.library.custom_op("kiln_test::scale_buf", mutates_args=("buf",))
def scale_buf(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    buf.mul_(2)
    return x + buf


@scale_buf.register_fake
def _(x, buf):
    return torch.empty_like(x)


_LIB.define("inc_(Tensor(a!) x, float v) -> Tensor(a!)")


def _inc(x, v):
    x.add_(v)
    return x


_LIB.impl("inc_", _inc, "CompositeExplicitAutograd")
torch.library.register_fake("kiln_test_def::inc_", lambda x, v: x, lib=_LIB)


def _check_mutation(fn, make, fullgraph=True):
    """Results and every argument's value after the call match eager's (fresh inputs)."""
    compiled = kiln.compile(fn, fullgraph=fullgraph)
    for _ in range(2):
        args = make()
        copies = [a.clone() for a in args]
        got, want = compiled(*args), fn(*copies)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert_close(g, w)
        for a, c in zip(args, copies):
            assert_close(a, c)


def test_mutating_op_into_a_graph_input_is_functionalized():
    def fn(x, out):
        add_into(x * 2, out)
        return out + 1
    _one_graph(fn, torch.randn(4), torch.zeros(4), kernels=1)
    assert "custom_op_mutating" in kiln.explain(fn)(torch.randn(4), torch.zeros(4)).compiles[0].graph.python()
    _check_mutation(fn, lambda: (torch.randn(4), torch.randn(4)))


def test_mutating_op_through_a_view_and_returning_its_argument():
    def fn(x, buf):
        y = scale_buf(x.sin(), buf[1:])                         # writes through a view of buf
        t = torch.ops.kiln_test_def.inc_(x.clone(), 3.0)        # `-> Tensor(a!)`: its argument
        return y * 2, t + 1, buf.sum()
    _one_graph(fn, torch.randn(3), torch.randn(4), kernels=1)
    _check_mutation(fn, lambda: (torch.randn(3), torch.randn(4)))


def test_mutating_op_with_aliased_arguments_is_a_break_with_the_reason():
    def fn(x):
        add_into(x, x)  # reads and writes one tensor: eager's answer depends on the op's order
        return x * 2
    e = kiln.explain(fn)(torch.randn(4))
    assert e.graph_break_count >= 1
    assert "shares memory" in e.break_reasons[0].reason, e.break_reasons
    _check_mutation(fn, lambda: (torch.randn(4),), fullgraph=False)


def test_mutating_op_with_a_gradient_is_a_break_with_the_reason():
    def fn(x, out):
        add_into(x * 2, out)
        return out.sum()
    x = torch.randn(4, requires_grad=True)
    e = kiln.explain(fn)(x, torch.zeros(4))
    assert e.graph_break_count >= 1
    assert "gradient" in e.break_reasons[0].reason, e.break_reasons


@torch.library.custom_op("kiln_test::sin_into_list", mutates_args=["out_list"],
                         schema="(Tensor x, Tensor(a!)[]? out_list) -> Tensor")
def sin_into_list(x, out_list):
    r = x.sin()
    if out_list is not None:
        out_list[0].copy_(r)
    return r


@sin_into_list.register_fake
def _(x, out_list):
    return torch.empty_like(x)


def test_mutating_op_on_a_tensor_list_is_functionalized():
    """A written ``Tensor(a!)[]?`` (peer test_fallback_mutable_op_list_tensor, under
    fullgraph=True): each tensor of the list is written back, an omitted list writes nothing."""
    def fn(x):
        x = x * 3
        s = [torch.empty_like(x)]
        x = sin_into_list(x, s)
        return x / 3, s[0]

    def two(x, outs):
        return sin_into_list(x * 2, outs) + 1, sin_into_list(x, None)
    x = torch.randn(3)
    e = kiln.explain(fn)(x)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(got, want)
    mine, theirs = [torch.zeros(3), torch.ones(2)], [torch.zeros(3), torch.ones(2)]
    got, want = kiln.compile(two, fullgraph=True)(x, mine), two(x, theirs)
    for g, w in zip(got + tuple(mine), want + tuple(theirs)):
        assert_close(g, w)


@torch.library.custom_op("kiln_test::sin_into_both", mutates_args=["outs"],
                         schema="(Tensor x, Tensor(a!)[] outs) -> ()")
def sin_into_both(x, outs):
    outs[0].copy_(x.sin())
    outs[1].copy_(x.cos())


@sin_into_both.register_fake
def _(x, outs):
    return None


def test_a_list_whose_tensors_share_memory_is_a_break():
    """Two list entries that are views of one buffer: eager's answer depends on the op's write
    order, which copies would not keep."""
    def fn(x, buf):
        sin_into_both(x, [buf[0], buf[0]])
        return buf * 1
    x = torch.randn(3)
    e = kiln.explain(fn)(x, torch.zeros(2, 3))
    assert e.graph_break_count >= 1
    assert "shares memory" in e.break_reasons[0].reason, e.break_reasons
    mine, theirs = torch.zeros(2, 3), torch.zeros(2, 3)
    assert_close(kiln.compile(fn)(x, mine), fn(x, theirs))
    assert_close(mine, theirs)


def test_torch_own_namespaces_keep_the_aten_path():
    """Collectives and FSDP's copy ops are torch's, not user ops: never copied to functionalize
    them (a wait on a copy would wait on nothing)."""
    from kiln.capture.custom_ops import is_user_op
    pytest.importorskip("torch.distributed._functional_collectives")
    assert not is_user_op(torch.ops._c10d_functional.wait_tensor.default)
    assert not is_user_op(torch.ops.aten.add.Tensor)
    assert is_user_op(torch.ops.kiln_test.mysin.default)


def test_module_training_steps_match_eager():
    """Linear -> custom op (register_autograd) -> LayerNorm -> Linear, three SGD steps: the
    parameters stay equal to eager's."""
    import copy

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.ln, self.b = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.b(self.ln(mysin(self.a(x))))
    torch.manual_seed(0)
    m = M()
    ref = copy.deepcopy(m)
    compiled = kiln.compile(m, fullgraph=True)
    opt, opt_ref = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(8, 16)
        for model, o in ((compiled, opt), (ref, opt_ref)):
            model(x).pow(2).mean().backward()
            o.step()
            o.zero_grad()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert_close(p, q)


def test_mutating_op_under_no_grad_on_tensors_that_require_grad():
    def fn(x, out):
        with torch.no_grad():
            add_into(x * 2, out)
        return out * 3
    make = lambda: (torch.randn(4, requires_grad=True), torch.randn(4))  # noqa: E731
    e = kiln.explain(fn)(*make())
    assert e.graph_break_count == 0, e.break_reasons
    args = make()
    copies = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    assert_close(kiln.compile(fn, fullgraph=True)(*args), fn(*copies))
    assert_close(args[1], copies[1])
