"""Graphs that touch more than one device, as torch allows: a 0-d CPU tensor beside GPU
tensors acts as a scalar (copied over by ``prims.device_put``), a value torch computes on the
CPU inside a GPU graph (``torch.arange(n)`` without a device) is computed by torch from the
wrapper, and other device mixes are the user's error, raised as eager raises it. Tensors on
the meta device run eagerly."""
import pytest
import torch

import kiln
from kiln.graph import Graph, Proxy
from kiln.inductor import ir
from kiln.inductor.lower import lower
from kiln.meta import TensorMeta
from kiln.ops import core
from kiln.ops.decompose import decompose
from testing import TOLERANCES

CUDA = torch.device("cuda", 0)


def _on(t, device):
    m = TensorMeta.of(t)
    return TensorMeta(m.shape, m.stride, m.dtype, device, False)


def _prims_graph(fn, *metas):
    g = Graph()
    proxies = [Proxy(g.placeholder(f"a{i}", m)) for i, m in enumerate(metas)]
    out = fn(*proxies)
    g.output(out if isinstance(out, tuple) else (out,))
    return decompose(g)


def test_a_cpu_scalar_beside_gpu_tensors_is_copied_over_and_cpu_values_are_externs():
    x, s = _on(torch.randn(4, 3), CUDA), _on(torch.tensor(2.0), torch.device("cpu"))

    def f(x, s):
        cpu = core.mul(core.arange(0, 4, 1, torch.int64, torch.device("cpu")), 2)
        return core.add(core.mul(x, s), 1), cpu
    program = lower(_prims_graph(f, x, s))
    assert program.device == CUDA
    kinds = {b.name: (type(b).__name__, getattr(b, "op", None) and b.op.name, b.device.type)
             for b in program.buffers}
    puts = [k for k, (t, op, d) in kinds.items() if op == "device_put"]
    assert len(puts) == 1 and kinds[puts[0]][2] == "cuda", kinds
    # no kernel in the GPU graph computes a CPU buffer: the CPU values are torch calls
    for b in program.buffers:
        if b.device.type == "cpu":
            assert isinstance(b, ir.Extern), b
    computed = [b for b in program.buffers if not isinstance(b, ir.Extern)]
    assert computed and all(b.device == CUDA for b in computed)
    # and the GPU kernel reads the copied scalar, never the CPU input
    reads = set().union(*(b.reads() for b in computed))
    assert "arg1" not in reads and puts[0] in reads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_cpu_scalar_tensor_argument_matches_eager(dtype):
    def f(x, s):
        return torch.where(x > s, x * s, s - x) + s

    g = kiln.compile(f)
    for _ in range(2):
        x = torch.randn(6, 5, dtype=dtype).t()  # non-contiguous
        s = torch.tensor(0.5, dtype=dtype)
        rtol, atol = TOLERANCES[dtype]
        torch.testing.assert_close(g(x, s), f(x, s), rtol=rtol, atol=atol)


def test_a_device_mix_torch_refuses_raises_the_users_error():
    def f(x):
        y = x * 2
        return torch.arange(x.shape[0], dtype=torch.float32) + y[:, 0]

    x = torch.randn(4, 2, device="meta")
    with pytest.raises(RuntimeError) as got:
        kiln.compile(f)(x)
    with pytest.raises(RuntimeError) as want:
        f(x)
    assert str(got.value) == str(want.value)
    assert "f" in [e.name for e in got.traceback]  # raised from the user's own frame


def test_meta_tensors_run_eagerly():
    def f(x, w):
        return torch.relu(x @ w).sum(-1) * 2, x.t().contiguous()

    x, w = torch.randn(8, 4, device="meta"), torch.randn(4, 3, device="meta")
    got, want = kiln.compile(f)(x, w), f(x, w)
    for a, e in zip(got, want):
        assert a.device.type == "meta" and a.shape == e.shape and a.dtype == e.dtype and a.stride() == e.stride()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_values_and_scalars_inside_a_gpu_graph_match_eager(dtype):
    def f(x, s):
        n = x.shape[0]
        idx = torch.arange(n)  # on the CPU: torch's default device
        return x * s + n, idx * 2, (idx.to(dtype) * s).sum(), torch.arange(n, device=x.device) + x[:, 0]

    g = kiln.compile(f, dynamic=True)
    rtol, atol = TOLERANCES[dtype]
    for n in (3, 5, 8):
        x = torch.randn(4, n, device="cuda", dtype=dtype).t()
        s = torch.tensor(1.5, dtype=dtype)
        for a, e in zip(g(x, s), f(x, s)):
            assert a.device == e.device and a.dtype == e.dtype and a.shape == e.shape
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
