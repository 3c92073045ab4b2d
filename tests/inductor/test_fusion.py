"""Lowering and scheduling: structural assertions on the loop IR and kernels, then a run
against eager."""
import pytest
import torch

import kiln
from kiln import context
from kiln.graph import Graph, Proxy
from kiln.inductor import ir
from kiln.inductor.lower import lower
from kiln.inductor.scheduler import schedule
from kiln.meta import TensorMeta
from kiln.ops import core
from kiln.ops.decompose import decompose
from kiln.pipeline import compile_graph
from testing import TARGETS, assert_close, on_target, randn


def transform(x, bias):
    y = x + bias
    y = torch.relu(y)
    return y * 2


def _prims_graph(fn, *tensors):
    g = Graph()
    proxies = [Proxy(g.placeholder(f"a{i}", TensorMeta.of(t))) for i, t in enumerate(tensors)]
    out = fn(*proxies)
    g.output(out if isinstance(out, tuple) else (out,))
    return decompose(g)


def test_pointwise_chain_lowers_to_one_buffer_and_one_kernel():
    x, b = torch.randn(8, 16), torch.randn(16)
    pg = _prims_graph(lambda x, b: core.mul(core.relu(core.add(x, b)), 2), x, b)
    program = lower(pg)
    assert len(program.buffers) == 1 and isinstance(program.buffers[0], ir.Pointwise)
    ops = [e.op for e in ir.walk(program.buffers[0].body) if isinstance(e, ir.Call)]
    assert ops == ["add", "maximum", "mul"]
    sched = schedule(program)
    assert len(sched.kernels) == 1 and sched.kernels[0].stores == ["buf0"]


@pytest.mark.parametrize("target", TARGETS)
def test_seed_example_is_one_kernel_and_bitwise_equal(target):
    with on_target(target) as device:
        x, b = torch.randn(64, 48, device=device), torch.randn(48, device=device)
        explain = kiln.explain(transform)(x, b)
        assert (explain.graph_count, explain.graph_break_count, explain.kernel_count) == (1, 0, 1)
        assert explain.extern_calls == 0
        out = kiln.compile(transform)(x, b)
        assert torch.equal(out, transform(x, b))


@pytest.mark.parametrize("target", TARGETS)
def test_two_outputs_of_one_shape_share_a_kernel(target):
    def f(x, y):
        s = torch.sigmoid(x) * y
        return s + 1, s.exp() * x
    with on_target(target) as device:
        x, y = randn((16, 8), torch.float32, device), randn((16, 8), torch.float32, device)
        e = kiln.explain(f)(x, y)
        assert e.kernel_count == 1
        a, b = kiln.compile(f)(x, y)
        ea, eb = f(x, y)
        assert_close(a, ea)
        assert_close(b, eb)


def test_shapes_that_differ_get_separate_kernels_with_reason_logged(capsys):
    def f(x, b):
        y = x * 2  # [4, 8]
        return y, b + 1  # [8]
    x, b = torch.randn(4, 8), torch.randn(8)
    from kiln import log
    log.configure("schedule")
    try:
        e = kiln.explain(f)(x, b)
    finally:
        log.configure("")
    assert e.kernel_count == 2
    assert "do not fuse buf1 into kernel0: iteration spaces differ" in capsys.readouterr().err


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_epilogue_fused_after_library_matmul(target, dtype):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 24)

        def forward(self, x, bias):
            return torch.relu(self.linear(x) + bias) * 2

    with on_target(target) as device:
        m = Model().to(device=device, dtype=dtype)
        x = randn((2, 5, 16), dtype, device)
        b = randn((24,), dtype, device)
        with torch.no_grad():
            e = kiln.explain(m)(x, b)
            assert (e.graph_count, e.graph_break_count, e.kernel_count, e.extern_calls) == (1, 0, 1, 1)
            cm = kiln.compile(m)
            assert_close(cm(x, b), m(x, b))


def test_non_contiguous_input_to_matmul_is_copied_correctly():
    w = torch.randn(12, 8)
    x = torch.randn(8, 3, 5).permute(1, 2, 0)  # [3, 5, 8], not viewable as [15, 8]
    with torch.no_grad():
        fn = lambda x, w: torch.nn.functional.linear(x, w) * 3  # noqa: E731
        assert_close(kiln.compile(fn)(x, w), fn(x, w))


def test_every_stage_artifact_is_kept():
    x, b = torch.randn(4, 4), torch.randn(4)
    g = Graph()
    xp, bp = (Proxy(g.placeholder(n, TensorMeta.of(t))) for n, t in (("x", x), ("b", b)))
    g.output((core.mul(core.relu(core.add(xp, bp)), 2),))
    with context.compiling("t") as ctx:
        compiled = compile_graph(g)
    names = [name for _, name, _ in ctx.artifacts]
    for expected in ("propagate_meta", "decompose", "dce", "cse", "lower", "schedule",
                     "generate_kernels", "generate_wrapper", "build"):
        assert expected in names
    assert set(ctx.stage_times) >= {"meta", "decomp", "lowering", "scheduling", "codegen", "build"}
    assert torch.equal(compiled(x, b)[0], torch.relu(x + b) * 2)


def _gelu_bias_residual(x, b, r):
    return torch.nn.functional.gelu(x + b, approximate="tanh") + r


ONE_KERNEL = {  # issue 5: each compiles to exactly one kernel on every target
    "softmax": (lambda x: torch.softmax(x, -1), lambda dt, dev: (randn((6, 40), dt, dev),)),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), lambda dt, dev: (randn((6, 40), dt, dev),)),
    "layer_norm": (lambda x, w, b: torch.nn.functional.layer_norm(x, (40,), w, b),
                   lambda dt, dev: (randn((6, 40), dt, dev), randn((40,), dt, dev), randn((40,), dt, dev))),
    "rms_norm": (lambda x, w: torch.nn.functional.rms_norm(x, (40,), w, 1e-6),
                 lambda dt, dev: (randn((6, 40), dt, dev), randn((40,), dt, dev))),
    "cross_entropy_row": (lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction="none"),
                          lambda dt, dev: (randn((6, 40), dt, dev), torch.randint(0, 40, (6,), device=dev))),
    "gelu_bias_residual": (_gelu_bias_residual,
                           lambda dt, dev: (randn((6, 40), dt, dev, layout="transposed"), randn((40,), dt, dev),
                                            randn((6, 40), dt, dev))),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(ONE_KERNEL))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_issue_cases_are_exactly_one_kernel(name, target, dtype):
    fn, make = ONE_KERNEL[name]
    with on_target(target) as device, torch.no_grad():
        assert kiln.explain(fn, dynamic=False)(*make(dtype, device)).kernel_count == 1
        f = kiln.compile(fn, dynamic=False)
        for _ in range(2):
            args = make(dtype, device)
            assert_close(f(*args), fn(*args))


@pytest.mark.parametrize("target", TARGETS)
def test_cat_feeding_a_pointwise_consumer_is_not_materialized(target):
    """The consumer's loads pick the part by index range: one kernel, no buffer for the cat."""
    def f(a, b, c):
        return torch.cat([a, b * 2, c], dim=1).sigmoid() + 1
    with on_target(target) as device:
        a, b, c = (randn((5, 3), torch.float32, device), randn((5, 4), torch.float32, device, layout="transposed"),
                   randn((5, 1), torch.float32, device).expand(5, 2))
        e = kiln.explain(f, dynamic=False)(a, b, c)
        assert e.kernel_count == 1
        out = kiln.compile(f, dynamic=False)(a, b, c)
        assert_close(out, f(a, b, c))


@pytest.mark.parametrize("target", TARGETS)
def test_norm_flattened_for_a_matmul_stays_in_the_norm_kernel(target):
    """A transformer block's residual add + layer norm whose output is viewed as [rows, dim]
    for the next matmul: the [rows, dim] buffer is a linear re-indexing of the norm kernel's
    [batch, seq, dim] space, so it fuses there (one kernel, one library call)."""
    def block(x, r, w, b, W):
        h = x + r
        y = torch.nn.functional.layer_norm(h, (16,), w, b)
        return y.reshape(-1, 16) @ W
    with on_target(target) as device, torch.no_grad():
        args = lambda: (randn((2, 5, 16), torch.float32, device), randn((2, 5, 16), torch.float32, device),  # noqa: E731
                        randn((16,), torch.float32, device), randn((16,), torch.float32, device),
                        randn((16, 8), torch.float32, device))
        e = kiln.explain(block, dynamic=False)(*args())
        assert (e.kernel_count, e.extern_calls) == (1, 1)
        f = kiln.compile(block, dynamic=False)
        for _ in range(2):
            a = args()
            torch.testing.assert_close(f(*a), block(*a), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_per_row_values_of_a_reshaped_row_space_fuse(target):
    def f(x):
        return torch.logsumexp(x, -1).reshape(-1) * 2  # [2, 6] rows read as [12]
    with on_target(target) as device:
        x = randn((2, 6, 10), torch.float32, device)
        assert kiln.explain(f, dynamic=False)(x).kernel_count == 1
        assert_close(kiln.compile(f, dynamic=False)(x), f(x))
