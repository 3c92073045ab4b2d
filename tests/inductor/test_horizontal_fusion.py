"""Horizontal fusion: independent pointwise kernels over the same number of elements share one
kernel (one launch), unless that would keep a result live across later steps; the `schedule`
channel says why each candidate was or wasn't fused."""
import pytest
import torch

import kiln
from kiln import log
from kiln.inductor.scheduler import common_ranges
from testing import TARGETS, assert_close, on_target, randn


def two_chains(a, b):
    return a.exp() * 2, torch.sigmoid(b) + 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shapes", [((8, 32), (8, 32)), ((8, 32), (32, 8)), ((8, 32), (256,)),
                                    ((2, 12), (6, 4)), ((6, 4), (4, 6))],
                         ids=["same", "transposed_shape", "flat", "refined", "no_common_refinement"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_independent_chains_are_one_kernel(target, shapes, dtype):
    with on_target(target) as device:
        a, b = randn(shapes[0], dtype, device), randn(shapes[1], dtype, device)
        assert kiln.explain(two_chains, dynamic=False)(a, b).kernel_count == 1
        f = kiln.compile(two_chains, dynamic=False)
        for _ in range(2):  # fresh inputs each call
            a, b = randn(shapes[0], dtype, device), randn(shapes[1], dtype, device)
            out, ref = f(a, b), two_chains(a, b)
            assert_close(out[0], ref[0])
            assert_close(out[1], ref[1])


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous_and_broadcast_inputs(target):
    def f(a, bias, c):
        return torch.relu(a + bias), c * 3 - 1
    with on_target(target) as device:
        a = randn((12, 16), torch.float32, device, layout="transposed")
        bias = randn((16,), torch.float32, device)
        c = randn((4, 48), torch.float32, device)[:, ::1].t()  # [48, 4], strided
        assert kiln.explain(f, dynamic=False)(a, bias, c).kernel_count == 1
        out, ref = kiln.compile(f, dynamic=False)(a, bias, c), f(a, bias, c)
        assert_close(out[0], ref[0])
        assert_close(out[1], ref[1])


@pytest.mark.parametrize("target", TARGETS)
def test_vertical_read_through_a_reshape_joins_the_refined_kernel(target):
    def f(a, b):
        y = a * 2
        return y, y.reshape(64) + b
    with on_target(target) as device:
        a, b = randn((8, 8), torch.float32, device), randn((64,), torch.float32, device)
        assert kiln.explain(f, dynamic=False)(a, b).kernel_count == 1
        out, ref = kiln.compile(f, dynamic=False)(a, b), f(a, b)
        assert_close(out[0], ref[0])
        assert_close(out[1], ref[1])


def test_different_numel_stays_apart_with_reason(capsys):
    log.configure("schedule")
    try:
        e = kiln.explain(two_chains, dynamic=False)(torch.randn(8, 32), torch.randn(8, 16))
    finally:
        log.configure("")
    assert e.kernel_count == 2
    assert "iteration spaces differ" in capsys.readouterr().err


def test_fused_pair_is_logged_as_horizontal(capsys):
    log.configure("schedule")
    try:
        kiln.explain(two_chains, dynamic=False)(torch.randn(8, 32), torch.randn(32, 8))
    finally:
        log.configure("")
    assert "fuse buf1 into kernel0 (horizontal" in capsys.readouterr().err


def test_not_fused_when_the_result_would_live_across_a_library_call(capsys):
    """b = y.sin() could join a*2's kernel, before the matmul; its result would then be live
    during the matmul for nothing, so it keeps its own kernel after it."""
    def f(x, w, y):
        a = x * 2
        return a @ w, y.sin()
    # 1024x1024: results up to scheduler.PEAK_IGNORE_BYTES (1 MiB) never count for peak memory
    x, w, y = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.randn(1024, 1024)
    log.configure("schedule")
    try:
        with torch.no_grad():
            e = kiln.explain(f, dynamic=False)(x, w, y)
    finally:
        log.configure("")
    assert e.kernel_count == 2
    assert "peak memory could rise" in capsys.readouterr().err
    with torch.no_grad():
        out, ref = kiln.compile(f, dynamic=False)(x, w, y), f(x, w, y)
    assert_close(out[0], ref[0])
    assert_close(out[1], ref[1])


def test_common_ranges():
    assert common_ranges((4, 8), (32,)) == (4, 8)
    assert common_ranges((2, 12), (6, 4)) == (2, 3, 4)
    assert common_ranges((6, 4), (4, 6)) is None
    assert common_ranges((2, 3, 4), (24,)) == (2, 3, 4)



@pytest.mark.parametrize("target", TARGETS)
def test_alternating_layouts_keep_the_kernel_index_maps_small(target, monkeypatch):
    # siblings alternately contiguous and transposed: each one in memory order re-spaces the
    # shared kernel, and each composed index map must be simplified over the new ranges, or it
    # nests one floor/modulo layer per join (8189 operations at 12 siblings; the op table's
    # batched floor_divide case spent 9 minutes in sympy on them)
    import sympy
    from kiln.inductor import scheduler
    largest, reshape = [0], scheduler.Kernel.reshape

    def recording(self, *args, **kw):
        reshape(self, *args, **kw)
        largest[0] = max([largest[0]] + [sympy.count_ops(e) for m in self.maps.values() if m
                                         for e in m.values()])
    monkeypatch.setattr(scheduler.Kernel, "reshape", recording)

    def f(*xs):
        return tuple(torch.floor_divide(x, -3) + x % 2.5 for x in xs)
    with on_target(target) as device:
        xs = [randn((6, 10), torch.float32, device, layout="transposed" if k % 2 else "contiguous")
              for k in range(12)]
        out, ref = kiln.compile(f, dynamic=False)(*xs), f(*xs)
        assert 0 < largest[0] <= 12, f"an index map of {largest[0]} operations"
        for o, r in zip(out, ref):
            assert_close(o, r)


def test_a_recompute_waits_for_the_backward_that_reads_the_same_input():
    # a two-layer SiLU MLP's backward: each layer's recomputed SiLU (for its down projection's
    # weight gradient) belongs with that layer's SiLU backward, which reads the same
    # pre-activation; joined horizontally to the other layer's kernel, it made layer 0 compute
    # its sigmoid twice. One sigmoid per layer in the backward, and grads as eager's.
    torch.manual_seed(0)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.ModuleList(torch.nn.Linear(32, 96, bias=False) for _ in range(2))
            self.down = torch.nn.ModuleList(torch.nn.Linear(96, 32, bias=False) for _ in range(2))

        def forward(self, x):
            for up, down in zip(self.up, self.down):
                x = x + down(torch.nn.functional.silu(up(x)))
            return x.square().sum()

    m = MLP()
    x = torch.randn(64, 32)
    cm = kiln.compile(m, dynamic=False)
    with kiln.config.patch(strict=True, cpu_backend="cpp"):
        r = kiln.explain(lambda t: cm(t).backward())(x)
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).backward()
    for g, p in zip(got, m.parameters()):
        assert_close(g, p.grad)
    backward = r.kernels[len(r.kernels_per_graph[0]):]  # the forward's kernels come first
    assert backward
    calls = sum(k.source[k.source.index('extern "C" void'):].count("kiln_sigmoidf(") for k in backward)
    assert calls == 2, calls
