"""torch.autocast in capture: compiled results match eager under autocast in values AND dtypes.

Covers `with torch.autocast(...)` inside compiled code, a compiled function called inside an
autocast region (ambient state, guarded: calling outside recompiles), nesting and
enabled=False, torch.cpu.amp.autocast, the decorator form, and training (grads through the
casts). CUDA cases run only where CUDA is present.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln.capture import trace
from kiln.ops import autocast as policy_table
from testing import TARGETS, assert_close, on_target, randn

BACKENDS = ["eager", "aot_eager", "kiln"]
CUDA = torch.cuda.is_available()


def _cpu_fp16_ok() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16
    except Exception:  # noqa: BLE001 - older torch: CPU autocast is bf16 only
        return False


CPU_DTYPES = [torch.bfloat16] + ([torch.float16] if _cpu_fp16_ok() else [])
DEVICE_DTYPES = [pytest.param(("cpu", d), id=f"cpu-{str(d)[6:]}") for d in CPU_DTYPES]
if CUDA:
    DEVICE_DTYPES += [pytest.param(("cuda", d), id=f"cuda-{str(d)[6:]}")
                      for d in (torch.float16, torch.bfloat16)]


def check_same(out, ref, dtype):
    """Same structure, same dtypes, values close at the autocast dtype's tolerance."""
    if isinstance(ref, (tuple, list)):
        assert isinstance(out, (tuple, list)) and len(out) == len(ref)
        for o, r in zip(out, ref):
            check_same(o, r, dtype)
        return
    if not isinstance(ref, torch.Tensor):
        assert out == ref
        return
    assert out.dtype == ref.dtype, f"dtype {out.dtype} != eager's {ref.dtype}"
    assert_close(out.float(), ref.float(), dtype=dtype)


def compiled_vs_eager(fn, args, backend, ac_dtype, ambient=None):
    """Run fn compiled and eagerly (under `ambient` autocast when given) and compare."""
    cfn = kiln.compile(fn, backend=backend)
    ctx = (lambda: torch.autocast(ambient[0], dtype=ambient[1])) if ambient else _null
    with ctx():
        ref = fn(*args)
    with ctx():
        out = cfn(*args)
    check_same(out, ref, ac_dtype)
    assert kiln.stats().get("graph_breaks", 0) == 0, "expected one graph, no break"
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------ the model
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x, target):
        h = self.fc1(x)
        p = torch.softmax(h, -1)
        n = self.ln(p * 4.0)
        logits = self.fc2(n)
        loss = F.cross_entropy(logits, target)
        return h, p, n, logits, loss


def _model_inputs(device, layout="contiguous"):
    torch.manual_seed(0)
    net = Net().to(device)
    x = randn((6, 16), torch.float32, device, layout)
    target = torch.randint(0, 8, (6,), device=device)
    return net, x, target


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dev_dtype", DEVICE_DTYPES)
def test_model_with_statement(backend, dev_dtype):
    device, dtype = dev_dtype
    net, x, target = _model_inputs(device)

    def fn(x, target):
        with torch.autocast(device, dtype=dtype):
            return net(x, target)

    out = compiled_vs_eager(fn, (x, target), backend, dtype)
    assert out[0].dtype == dtype and out[4].dtype == torch.float32  # linear low, loss fp32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dev_dtype", DEVICE_DTYPES)
def test_model_called_inside_autocast(backend, dev_dtype):
    device, dtype = dev_dtype
    net, x, target = _model_inputs(device, "transposed")  # non-contiguous input
    compiled_vs_eager(net, (x, target), backend, dtype, ambient=(device, dtype))


@pytest.mark.parametrize("target", TARGETS)
def test_model_kiln_codegen_targets(target):
    with on_target(target) as device:
        net, x, t = _model_inputs(device)
        compiled_vs_eager(net, (x, t), "kiln", torch.bfloat16, ambient=(device.type, torch.bfloat16))


# ------------------------------------------------------------------ single ops
B, M, K, N = 2, 4, 8, 6
OPS = {  # name -> (fn, input shapes); inputs are fp32 unless the test says otherwise
    "mm": (lambda a, b: torch.mm(a, b), [(M, K), (K, N)]),
    "matmul_op": (lambda a, b: a @ b, [(M, K), (K, N)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(B, M, K), (B, K, N)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b), [(N,), (M, K), (K, N)]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b), [(B, M, N), (B, M, K), (B, K, N)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(M, K), (N, K), (N,)]),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), [(1, 3, 5, 5), (4, 3, 3, 3)]),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [(B, 2, M, K)] * 3),
    "softmax": (lambda x: torch.softmax(x, -1), [(M, K)]),
    "log_softmax": (lambda x: F.log_softmax(x, -1), [(M, K)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (K,), w, b), [(M, K), (K,), (K,)]),
    "group_norm": (lambda x: F.group_norm(x, 2), [(2, 4, 3)]),
    "exp_sum": (lambda x: torch.exp(x).sum(-1), [(M, K)]),
    "prod": (lambda x: (x * 0.5 + 1).prod(-1), [(M, K)]),
    "cumsum": (lambda x: torch.cumsum(x, 1), [(M, K)]),
    "leaf_fallbacks": (lambda x, y: torch.logcumsumexp(x, 1) + torch.atan2(x, y), [(M, K), (M, K)]),
    "mse_loss": (lambda a, b: F.mse_loss(a, b), [(M, K), (M, K)]),
    "l1_loss": (lambda a, b: F.l1_loss(a, b), [(M, K), (M, K)]),
    "bce_logits": (lambda a, b: F.binary_cross_entropy_with_logits(a, b.sigmoid()), [(M, K), (M, K)]),
    "pow_rdiv": (lambda x: x ** 2 + 1.0 / (x.abs() + 1), [(M, K)]),
    "broadcast_add_mm": (lambda a, b, c: (a @ b) + c, [(M, K), (K, N), (N,)]),
    "cat_mixed": (lambda a, b: torch.cat([a @ b, a[:, :N]], 0), [(M, K), (K, N)]),
    "gelu_mean": (lambda x: F.gelu(x).mean(0), [(M, K)]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dev_dtype", DEVICE_DTYPES)
def test_single_op(name, backend, dev_dtype):
    device, dtype = dev_dtype
    if backend == "kiln" and dtype == torch.float16 and device == "cpu" and name not in (
            "mm", "softmax", "linear", "cat_mixed"):
        pytest.skip("fp16 CPU codegen covered by a few ops (compile time)")
    fn, shapes = OPS[name]
    torch.manual_seed(1)
    layouts = ["transposed" if len(s) >= 2 and i == 0 else "contiguous" for i, s in enumerate(shapes)]
    args = [randn(s, torch.float32, device, lay) for s, lay in zip(shapes, layouts)]

    def f(*a):
        with torch.autocast(device, dtype=dtype):
            return fn(*a)

    compiled_vs_eager(f, args, backend, dtype)


@pytest.mark.parametrize("dev_dtype", DEVICE_DTYPES)
def test_low_precision_inputs(dev_dtype):
    """Inputs already in the autocast dtype: fp32-policy ops upcast them (or, on CPU, do not)."""
    device, dtype = dev_dtype

    def f(x, w, t):
        with torch.autocast(device, dtype=dtype):
            h = x @ w
            return h, torch.softmax(h, -1), F.layer_norm(h, (h.shape[-1],)), F.cross_entropy(h, t)

    x, w = randn((M, K), dtype, device), randn((K, N), torch.float32, device)
    compiled_vs_eager(f, (x, w, torch.randint(0, N, (M,), device=device)), "aot_eager", dtype)


# ------------------------------------------------------------------ forms of autocast
def test_nested_and_disabled_region():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
            with torch.autocast("cpu", enabled=False):
                b = a.float() @ w.t()      # fp32 matmul inside the disabled region
                c = x @ w
            with torch.autocast("cpu"):    # dtype=None: the enclosing region's dtype
                d = x @ w
        e = x @ w                          # after the region: fp32 again
        return a, b, c, d, e

    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    out = compiled_vs_eager(f, (x, w), "eager", torch.bfloat16)
    assert [t.dtype for t in out] == [torch.bfloat16, torch.float32, torch.float32,
                                      torch.bfloat16, torch.float32]


def test_ambient_with_inner_disabled_region():
    """Called inside autocast, with an enabled=False region inside: the graph's fp32 matmul must
    stay fp32 at run time too (compiled code runs with torch's autocast off)."""
    def f(x, w):
        with torch.autocast("cpu", enabled=False):
            return x @ w, (x @ w).sum()

    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    for backend in BACKENDS:
        kiln.reset()
        out = compiled_vs_eager(f, (x, w), backend, torch.bfloat16, ambient=("cpu", torch.bfloat16))
        assert out[0].dtype == torch.float32


@pytest.mark.skipif(not hasattr(torch.cpu, "amp") or not hasattr(torch.cpu.amp, "autocast"),
                    reason="no torch.cpu.amp.autocast")
def test_cpu_amp_autocast_and_as_binding():
    import warnings

    def f(x, w):
        with torch.cpu.amp.autocast() as ac:       # bfloat16 by default
            y = x @ w
        with ac:                                   # the bound object enters again
            z = x @ w
        return y, z, x @ w

    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.cpu.amp.autocast is deprecated
        out = compiled_vs_eager(f, (x, w), "eager", torch.bfloat16)
    assert [t.dtype for t in out] == [torch.bfloat16, torch.bfloat16, torch.float32]


def test_decorator_forms():
    @torch.autocast("cpu", dtype=torch.bfloat16)
    def helper(x, w):
        return torch.softmax(x @ w, -1)

    def calls_helper(x, w):
        return helper(x, w) + 1, x @ w

    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    out = compiled_vs_eager(calls_helper, (x, w), "eager", torch.bfloat16)
    assert out[0].dtype == torch.bfloat16 and out[1].dtype == torch.float32
    kiln.reset()
    out = compiled_vs_eager(helper, (x, w), "eager", torch.bfloat16)   # compiled directly
    assert out.dtype == torch.bfloat16


def test_autocast_object_made_outside_and_state_query():
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)

    def f(x, w):
        with ctx:
            y = x @ w
            on = torch.is_autocast_enabled("cpu")
        return y, on, torch.is_autocast_enabled("cpu")

    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    out = compiled_vs_eager(f, (x, w), "eager", torch.bfloat16)
    assert out[0].dtype == torch.bfloat16 and out[1] is True and out[2] is False


def test_graph_is_autocast_free():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(x, w).softmax(-1)

    r = trace(f, (randn((M, K), torch.float32, "cpu"), randn((N, K), torch.float32, "cpu")))
    ops = [n.target.name for n in r.graph.nodes if n.op == "call"]
    assert ops.count("to_dtype") == 2 and "linear" in ops
    assert all(n.target.namespace == "core" for n in r.graph.nodes if n.op == "call")


def test_composite_fallback_under_autocast_breaks():
    """torch.einsum is composite in torch (its inner bmm autocasts): not a fallback node
    under autocast, so it is a graph break (run by torch inside the region, right dtype)
    instead of a wrong dtype; the resume function's exit of the region is a second break."""
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.einsum("ij,jk->ik", a, b)

    a, b = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.einsum("ij,jk->ik", a, b)
    out = kiln.compile(f, backend="eager")(a, b)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
    assert kiln.stats().get("graph_breaks", 0) == 2


@pytest.mark.skipif(CUDA, reason="checks the CPU-only build's behaviour")
def test_cuda_region_without_cuda_is_disabled():
    def f(x, w):
        with torch.autocast("cuda"):       # torch warns and disables it without CUDA
            return x @ w, torch.is_autocast_enabled("cuda")

    import warnings
    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = compiled_vs_eager(f, (x, w), "eager", torch.float32)
    assert out[0].dtype == torch.float32 and out[1] is False


def test_unsupported_device_type_breaks():
    def f(x):
        with torch.autocast("xpu", enabled=False):
            return x + 1

    with pytest.raises(kiln.GraphBreakError if hasattr(kiln, "GraphBreakError") else Exception,
                       match="autocast"):
        kiln.compile(f, fullgraph=True)(torch.ones(2))


# ------------------------------------------------------------------ guards
def test_guard_recompiles_outside_and_for_other_dtype():
    def f(x, w):
        return torch.softmax(x @ w, -1)

    cf = kiln.compile(f, backend="aot_eager")
    x, w = randn((M, K), torch.float32, "cpu"), randn((K, N), torch.float32, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = cf(x, w)
        ref_inside = f(x, w)
    outside = cf(x, w)
    check_same(inside, ref_inside, torch.bfloat16)
    check_same(outside, f(x, w), torch.float32)
    assert inside.dtype == torch.bfloat16 and outside.dtype == torch.float32
    assert kiln.stats()["recompiles"] == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cf(x, w)                                   # cached: no new compile
    assert kiln.stats()["recompiles"] == 1
    if torch.float16 in CPU_DTYPES:
        with torch.autocast("cpu", dtype=torch.float16):
            assert cf(x, w).dtype == torch.float16
        assert kiln.stats()["recompiles"] == 2
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert cf(x, w).dtype == torch.float32     # the fp32 entry matches again
    r = trace(f, (x, w))
    assert any("is_autocast_enabled" in g and "is False" in g for g in r.guards)


# ------------------------------------------------------------------ training
@pytest.mark.parametrize("backward_inside", [False, True], ids=["bwd_outside", "bwd_inside"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dev_dtype", DEVICE_DTYPES)
def test_training_grads_match(backend, dev_dtype, backward_inside):
    device, dtype = dev_dtype

    def run(model_fn, net, x, target):
        with torch.autocast(device, dtype=dtype):
            out = model_fn(x, target)
            if backward_inside:
                out[4].backward()
        if not backward_inside:
            out[4].backward()
        return out, [p.grad for p in net.parameters()], x.grad

    net, x, target = _model_inputs(device)
    x.requires_grad_()
    ref_out, ref_grads, ref_xg = run(net, net, x, target)
    net2, x2, _ = _model_inputs(device)
    x2 = x.detach().clone().requires_grad_()
    out, grads, xg = run(kiln.compile(net2, backend=backend), net2, x2, target)
    check_same(out, [o.detach() for o in ref_out], dtype)
    for g, rg in zip(grads, ref_grads):
        assert g.dtype == rg.dtype == torch.float32
        assert_close(g, rg, dtype=dtype)
    assert xg.dtype == ref_xg.dtype == torch.float32
    assert_close(xg, ref_xg, dtype=dtype)
    assert kiln.stats().get("graph_breaks", 0) == 0


# ------------------------------------------------------------------ the policy table
CPU_PROBES = {  # policy-table name -> eager call on (fp32 a, fp32 b) under CPU autocast
    "mm": lambda a, b: torch.mm(a, b), "linear": lambda a, b: F.linear(a, b),
    "bmm": lambda a, b: torch.bmm(a[None], b[None]), "matmul": lambda a, b: torch.matmul(a, b),
    "softmax": lambda a, b: torch.softmax(a, -1), "layer_norm": lambda a, b: F.layer_norm(a, (4,)),
    "exp": lambda a, b: a.exp(), "sum": lambda a, b: a.sum(), "prod": lambda a, b: a.prod(),
    "mse_loss": lambda a, b: F.mse_loss(a, b), "l1_loss": lambda a, b: F.l1_loss(a, b),
    "cross_entropy": lambda a, b: F.cross_entropy(a, b.softmax(-1)),
    "bce_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(a, b.sigmoid()),
    "cumsum": lambda a, b: a.cumsum(0), "log_softmax": lambda a, b: a.log_softmax(-1),
}


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("name", list(CPU_PROBES))
def test_cpu_policy_table_matches_torch(name, dtype):
    """The table's CPU policy predicts eager's output dtype for bf16 inputs (promote/unlisted:
    input dtype) and for fp32 inputs (lower: autocast dtype; fp32/unlisted: fp32)."""
    kind = policy_table.policy("cpu", name)
    for in_dtype in (torch.float32, dtype):
        a, b = torch.randn(4, 4).to(in_dtype), torch.randn(4, 4).to(in_dtype)
        with torch.autocast("cpu", dtype=dtype):
            got = CPU_PROBES[name](a, b).dtype
        expected = {policy_table.LOWER: dtype, policy_table.FP32: torch.float32}.get(kind, in_dtype)
        assert got == expected, f"{name}: policy {kind} predicts {expected}, torch gives {got}"
