"""A user's torch.autograd.Function under capture (kiln/capture/autograd_function.py,
autograd_function_backward.py, kiln/ops/core_autograd_function.py): with grad disabled its
forward is inlined into the graph; with grad enabled its backward is traced too and is the
gradient of the region (one graph, no break, as Dynamo); what cannot be traced is a break that
names the function, and eager autograd runs the user's backward."""
import pytest
import torch
from torch.autograd.function import once_differentiable

import kiln
from kiln.ops.core_autograd_function import CUSTOM_FUNCTIONS
from testing import assert_close


class ScaledGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        assert ctx.needs_input_grad == (False, False) or torch.is_grad_enabled() is False
        return x * 0.5 * scale * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.scale * (x > 0), None


class SetupStyle(torch.autograd.Function):
    @staticmethod
    def forward(x, y):
        return x * y + 1

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, output)

    @staticmethod
    def backward(ctx, g):
        x, y, out = ctx.saved_tensors
        return g * y + 0 * out, g * x


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return SetupStyle.apply(ScaledGelu.apply(self.fc(x), 2.0), x)


def _outputs(out):
    return [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]


def _loss(out):
    return sum((o.float() * (i + 1)).sum() for i, o in enumerate(_outputs(out)) if o.requires_grad)


def check(fn, *inputs, graphs=(1, 0), dtype=torch.float32, **opts):
    """Outputs and gradients (None where eager gives None) of the compiled fn against eager's;
    ``graphs``: the expected (graphs, breaks) of kiln.explain. Returns the break reasons."""
    out = kiln.explain(fn, **opts)(*inputs)
    reasons = [b.reason for b in out.break_reasons]
    assert (out.graph_count, out.graph_break_count) == graphs, reasons
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    want = fn(*inputs)
    want_grads = torch.autograd.grad(_loss(want), leaves, allow_unused=True)
    kiln.reset()
    got = kiln.compile(fn, **opts)(*inputs)
    got_grads = torch.autograd.grad(_loss(got), leaves, allow_unused=True)
    for a, e in zip(_outputs(got), _outputs(want)):
        assert a.requires_grad == e.requires_grad
        assert_close(a, e, dtype)
    for a, e in zip(got_grads, want_grads):
        assert (a is None) == (e is None)
        if e is not None:
            assert_close(a, e, dtype)
    return reasons


# ---------------------------------------------------------------- grad disabled
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inference_inlines_the_forward(dtype):
    torch.manual_seed(0)
    m = Block().to(dtype).eval()
    x = torch.randn(4, 8, 16, dtype=dtype).transpose(0, 1)  # non-contiguous
    with torch.no_grad():
        want = m(x)
        out = kiln.explain(m)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    assert_close(out.result, want, dtype)
    assert out.result.stride() == want.stride()
    with torch.no_grad():
        got = kiln.compile(m)(x)
    assert_close(got, want, dtype)
    assert kiln.stats()["eager_runs"] == 0


def test_a_replaced_forward_recompiles():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

    f = kiln.compile(lambda x: Twice.apply(x) + 1)
    x = torch.randn(5)
    with torch.no_grad():
        assert_close(f(x), x * 2 + 1, torch.float32)
        Twice.forward = staticmethod(lambda ctx, x: x * 3)
        assert_close(f(x), x * 3 + 1, torch.float32)


# ---------------------------------------------------------------- training: one graph
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_training_is_one_graph_and_every_gradient_matches_eager(dtype):
    torch.manual_seed(0)
    m = Block().to(dtype)
    x = torch.randn(4, 8, 16, dtype=dtype).transpose(0, 1).requires_grad_()  # non-contiguous
    out = kiln.explain(m)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    text = str(out.graphs[0])
    assert "core.autograd_function('ScaledGelu#" in text and "core.autograd_function('SetupStyle#" in text
    want = m(x)
    want.sum().backward()
    want_grads = [t.grad.clone() for t in (x, *m.parameters())]
    for t in (x, *m.parameters()):
        t.grad = None
    got = kiln.compile(m)(x)
    got.sum().backward()
    assert_close(got, want, dtype)
    for t, w in zip((x, *m.parameters()), want_grads):
        assert_close(t.grad, w, dtype)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_runs"] == 0 and stats["fallbacks"] == 0, stats


def test_dynamo_also_captures_the_block_whole():
    torch._dynamo.reset()
    peer = torch._dynamo.explain(Block())(torch.randn(3, 16, requires_grad=True))
    torch._dynamo.reset()
    assert (peer.graph_count, peer.graph_break_count) == (1, 0)


def test_the_users_backward_is_used_not_the_forwards_derivative():
    class RoundSTE(torch.autograd.Function):  # straight-through: round's derivative is 0
        @staticmethod
        def forward(ctx, x):
            return torch.round(x * 4) / 4

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.randn(5, 6, requires_grad=True)
    check(lambda x: (RoundSTE.apply(x) * 3).sum(), x)
    (g,) = torch.autograd.grad(kiln.compile(lambda x: (RoundSTE.apply(x) * 3).sum())(x), x)
    assert_close(g, torch.full_like(x, 3.0), torch.float32)


def test_saved_inputs_outputs_and_non_tensor_attributes():
    class ExpScaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, cfg):
            y = torch.exp(x) * w
            ctx.save_for_backward(y, w, None)  # an output, an input and None
            ctx.cfg, ctx.name, ctx.pair = cfg, "exp", (2, 0.5)
            return y

        @staticmethod
        def backward(ctx, g):
            y, w, nothing = ctx.saved_tensors
            assert nothing is None and ctx.name == "exp"
            k = ctx.cfg["k"] * ctx.pair[1]
            return g * y * k, g * y / w * ctx.pair[0], None

    x, w = torch.randn(3, 4, requires_grad=True), torch.rand(4, requires_grad=True) + 0.5
    check(lambda x, w: ExpScaled.apply(x, w, {"k": 3.0}), x, w)


class Needs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g @ w.t() if ctx.needs_input_grad[0] else None
        gw = x.t() @ g if ctx.needs_input_grad[1] else None
        return gx, gw


@pytest.mark.parametrize("which", ["both", "x", "w"])
def test_needs_input_grad_branches(which):
    x = torch.randn(3, 4, requires_grad=which in ("both", "x"))
    w = torch.randn(4, 5, requires_grad=which in ("both", "w"))
    check(lambda x, w: Needs.apply(x, w), x, w)


def test_a_none_gradient_is_no_gradient():
    class OnlyFirst(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g * 3, None

    x, y = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    check(lambda x, y: OnlyFirst.apply(x, y), x, y)
    (gy,) = torch.autograd.grad(kiln.compile(lambda x, y: OnlyFirst.apply(x, y).sum() + 0 * x.sum())(x, y),
                                y, allow_unused=True)
    assert gy is None


def test_non_differentiable_outputs_and_materialized_zeros():
    class Masked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m = (x > 0).to(x.dtype)
            ctx.mark_non_differentiable(m)
            ctx.save_for_backward(m)
            return x * m, m, x * 2, 7

        @staticmethod
        def backward(ctx, g, gm, g2, g7):
            (m,) = ctx.saved_tensors
            assert g7 is None
            return g * m + gm + g2 * 2  # gm and an unused g2 arrive as zeros

    x = torch.randn(4, 5, requires_grad=True)
    check(lambda x: Masked.apply(x), x)
    check(lambda x: Masked.apply(x)[0].exp(), x)  # the other outputs get no gradient
    y, m, _, seven = kiln.compile(lambda x: Masked.apply(x))(x)
    assert y.requires_grad and not m.requires_grad and seven == 7


def test_set_materialize_grads_false_gives_none_for_the_non_tensor_output():
    class NoZeros(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 2, "tag"

        @staticmethod
        def backward(ctx, g, g_tag):
            return g * 2 if g_tag is None else g * 100

    x = torch.randn(6, requires_grad=True)
    check(lambda x: NoZeros.apply(x)[0], x)


def test_setup_context_and_once_differentiable():
    class Sin(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x.sin()

        @staticmethod
        def setup_context(ctx, inputs, output):
            (x,) = inputs
            ctx.save_for_backward(x)

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos()

    x = torch.randn(3, 7, requires_grad=True)
    check(lambda x: Sin.apply(x) * x, x)


def test_setup_context_binds_keywords_and_defaults_as_apply_does():
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(x, n=2.0):
            return x * n

        @staticmethod
        def setup_context(ctx, inputs, output):
            assert len(ctx.needs_input_grad) == 2  # the default counts as an input
            ctx.n = inputs[1]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.n, None

    x = torch.randn(3, requires_grad=True)
    check(lambda x: Scaled.apply(x), x)
    check(lambda x: Scaled.apply(x, n=3.0), x)


def test_a_changing_float_on_ctx_is_a_graph_input_read_by_the_backward():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s):
            ctx.s = s
            return x * s

        @staticmethod
        def backward(ctx, g):
            return g * ctx.s, None

    f = kiln.compile(lambda x, s: Scale.apply(x, s))
    x = torch.randn(3, requires_grad=True)
    for s in (2.0, 3.0, 4.0):  # 3.0 recompiles with s a graph input; 4.0 reuses that entry
        (g,) = torch.autograd.grad(f(x, s).sum(), x)
        assert_close(g, torch.full((3,), s), torch.float32)
    stats = kiln.stats()
    assert (stats["recompiles"], stats["graph_breaks"], stats["cache_hits"]) == (1, 0, 1), stats


def test_an_output_that_views_its_input():
    class GradReverse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.alpha = alpha
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return -ctx.alpha * g, None

    x = torch.randn(4, 3, requires_grad=True)
    check(lambda x: GradReverse.apply(x * 2, 0.5).relu(), x)


def test_a_broadcast_gradient_is_summed_down_as_eager_does():
    class Bias(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            return x + b

        @staticmethod
        def backward(ctx, g):
            return g, g  # b's gradient keeps x's shape; eager sums it to b's

    x, b = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    check(lambda x, b: Bias.apply(x, b), x, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_model_of_custom_functions_trains_with_symbolic_sizes(dtype):
    m = Block().to(dtype)
    for n in (5, 9):
        x = torch.randn(n, 16, dtype=dtype, requires_grad=True)
        check(m, x, dtype=dtype, dynamic=True)


def test_a_replaced_backward_recompiles():
    class Flip(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return -g

    f = kiln.compile(lambda x: Flip.apply(x).sum())
    x = torch.randn(4, requires_grad=True)
    (g,) = torch.autograd.grad(f(x), x)
    assert_close(g, -torch.ones(4), torch.float32)
    Flip.backward = staticmethod(lambda ctx, g: g * 5)
    (g,) = torch.autograd.grad(f(x), x)
    assert_close(g, torch.full((4,), 5.0), torch.float32)


def test_the_eager_backends_run_the_users_backward():
    x = torch.randn(3, 16, requires_grad=True)
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        check(Block(), x, backend=backend)


def test_the_backward_graph_prints_and_runs():
    x = torch.randn(3, 16, requires_grad=True)
    out = kiln.explain(Block())(x)
    key = str(out.graphs[0]).split("core.autograd_function('")[1].split("'")[0]
    backward = CUSTOM_FUNCTIONS[key].backward
    assert "return g * ctx.scale * (x > 0), None" in backward.python()  # the user's line
    saved, g = torch.randn(3, 16), torch.randn(3, 16)
    (got,) = backward.as_function()(saved, g)
    assert_close(got, g * 2.0 * (saved > 0), torch.float32)


# ---------------------------------------------------------------- training: named breaks
def test_an_untraceable_backward_is_a_break_naming_the_function():
    class DataDependent(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2 if g.sum() > 0 else g * -2

    x = torch.randn(5, requires_grad=True)
    m = torch.nn.Linear(5, 5)
    (reason,) = check(lambda x: DataDependent.apply(m(x)).sum(), x, graphs=(2, 1))
    assert reason.startswith("DataDependent.backward is not captured (data-dependent branch")
    assert reason.endswith("DataDependent.apply runs eagerly")


def test_a_backward_reading_a_tensor_it_was_not_handed_is_a_break():
    w = torch.randn(6)

    class Closure(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * w

    x = torch.randn(6, requires_grad=True)
    (reason,) = check(lambda x: Closure.apply(x), x, graphs=(1, 1))
    assert "Closure.backward is not captured (it uses a tensor it was not handed" in reason


def test_an_unsaved_tensor_on_ctx_is_a_break():
    class Stash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.x = x
            return x * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g * ctx.x

    x = torch.randn(6, requires_grad=True)
    (reason,) = check(lambda x: Stash.apply(x), x, graphs=(1, 1))
    assert reason == ("Stash.apply with grad enabled: ctx.x holds a tensor that is not saved with "
                      "ctx.save_for_backward")


def test_mark_dirty_and_in_place_forwards_are_breaks():
    class Count(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, counter):
            counter.add_(1)
            ctx.mark_dirty(counter)
            return x * 2, counter

        @staticmethod
        def backward(ctx, g, g_counter):
            return g * 2, None

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = torch.randn(4, requires_grad=True)
    (reason,) = check(lambda x, c: Count.apply(x, c)[0], x, torch.zeros(()), graphs=(1, 1))
    assert reason.startswith("Count.forward is not captured (ctx.mark_dirty (an in-place forward) "
                             "with grad enabled at ")
    (reason,) = check(lambda x: Doubled.apply(x * 1), x, graphs=(2, 1))
    assert reason.startswith("Doubled.forward is not captured (Tensor.mul_: in-place update")


def test_gradients_eager_refuses_raise_as_eager_does():
    class TooFew(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    class WrongShape(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.sum()

    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    reasons = kiln.explain(lambda x, y: TooFew.apply(x, y))(x, y).break_reasons
    assert "TooFew.backward is not captured (returned 1 gradients for 2 inputs (eager raises)" in reasons[0].reason
    with pytest.raises(RuntimeError, match="returned an incorrect number of gradients"):
        kiln.compile(lambda x, y: TooFew.apply(x, y))(x, y).sum().backward()
    reasons = kiln.explain(lambda x: WrongShape.apply(x))(x).break_reasons
    assert "WrongShape.backward is not captured (returned a gradient of shape []" in reasons[0].reason
    with pytest.raises(RuntimeError, match="invalid gradient"):
        kiln.compile(lambda x: WrongShape.apply(x))(x).sum().backward()


def test_a_backward_that_writes_python_state_is_a_break():
    seen = []

    class Logs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(1)
            return g * 2

    x = torch.randn(3, requires_grad=True)
    (reason,) = check(lambda x: Logs.apply(x), x, graphs=(1, 1))
    assert reason.startswith("Logs.backward is not captured (Logs.backward changes a list or dict")
    assert seen  # eager's backward ran


def test_under_autocast_the_backward_runs_outside_it_unless_custom_bwd_reenters():
    class AmpMatmul(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu")
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.t(), x.t() @ g  # bf16 in the forward's region again

    class PlainMatmul(AmpMatmul):
        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.t(), x.t() @ g  # bf16 g @ fp32 w: eager raises outside autocast

    def step(fn):
        def f(x, w):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn.apply(x, w).float()
        return f

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    check(step(AmpMatmul), x, w, dtype=torch.bfloat16)
    out = kiln.explain(step(PlainMatmul))(x, w)
    assert "PlainMatmul.backward is not captured (operator @ failed" in out.break_reasons[0].reason
    with pytest.raises(RuntimeError, match="same dtype"):
        kiln.compile(step(PlainMatmul))(x, w).sum().backward()
