"""Attention in training runs torch's fused kernel once: the forward keeps the row
log-sum-exps (``core.sdpa_fused``), and the backward hands them to the same library's backward
(``core.sdpa_fused_backward``) without recomputing the forward. Gradients match eager's for
causal, masked, broadcast-masked and non-contiguous attention, in fp32, fp16 and bf16, at
static and dynamic sequence lengths; on CUDA for each of torch's fused kernels."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import build_joint, partition
from kiln.graph import Graph, Proxy
from kiln.meta import TensorMeta
from kiln.ops import attention, core
from testing import TOLERANCES

GRAD_TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


def _qkv(b, t, h, d, dtype=torch.float32, device="cpu"):
    """q, k, v as GPT-2 makes them: [B, H, T, D] views of one [B, T, 3, H, D] projection."""
    base = torch.randn(b, t, 3, h, d, dtype=dtype, device=device)
    return [base[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3)]


def _targets(node_list):
    return [n.target for n in node_list if n.op == "call"]


def test_the_backward_graph_reads_the_saved_log_sum_exp_and_never_reruns_attention():
    q, k, v = _qkv(2, 6, 2, 4)
    g = Graph()
    ps = [Proxy(g.placeholder(n, TensorMeta.of(t))) for n, t in zip("qkv", (q, k, v))]
    g.output((core.sdpa(*ps, None, 0.0, True),))
    part = partition(build_joint(g))
    fw, bw = _targets(part.forward.nodes), _targets(part.backward.nodes)
    assert attention.sdpa_fused in fw and core.sdpa not in fw
    assert attention.sdpa_fused_backward in bw
    assert not {core.sdpa, attention.sdpa_fused, core.sdpa_backward} & set(bw), bw
    saved = {n.name: n.meta["val"] for n in part.saved}
    assert any(m.dtype == torch.float32 and tuple(m.shape) == (2, 2, 6) for m in saved.values()), saved


def test_a_mask_that_needs_a_gradient_keeps_the_recomputing_rule():
    q, k, v = _qkv(1, 4, 2, 4)
    mask = torch.randn(4, 4, requires_grad=True)
    g = Graph()
    ps = [Proxy(g.placeholder(n, TensorMeta.of(t))) for n, t in zip("qkvm", (q, k, v, mask))]
    g.output((core.sdpa(*ps, 0.0, False),))
    fw = _targets(partition(build_joint(g)).forward.nodes)
    assert core.sdpa in fw and attention.sdpa_fused not in fw


def _check_training(fn, inputs, dtype, dynamic=False):
    compiled = kiln.compile(fn, dynamic=dynamic)
    rtol, atol = GRAD_TOL[dtype]
    for args in inputs:
        ref = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        got, want = compiled(*args), fn(*ref)
        torch.testing.assert_close(got, want, rtol=TOLERANCES[dtype][0] * 4, atol=TOLERANCES[dtype][1] * 4)
        gout = torch.randn_like(want)
        got.backward(gout)
        want.backward(gout)
        for a, r in zip(args, ref):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, r.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_causal_attention_over_non_contiguous_heads_trains_like_eager(dtype):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2
    _check_training(f, [_qkv(2, 5, 3, 8, dtype) for _ in range(2)], dtype)


@pytest.mark.parametrize("mask_kind", ["bool", "float", "broadcast_bool"])
def test_masked_attention_trains_like_eager(mask_kind):
    b, t, h = 2, 6, 2

    def make():
        q, k, v = _qkv(b, t, h, 4)
        if mask_kind == "bool":
            m = torch.rand(t, t) > 0.3
            m[:, 0] = True  # no row fully masked (eager gives NaN there)
        elif mask_kind == "float":
            m = torch.randn(t, t)
        else:
            m = torch.rand(b, 1, 1, t) > 0.3
            m[..., 0] = True
        return q, k, v, m

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    _check_training(f, [make() for _ in range(2)], torch.float32)


def test_attention_at_dynamic_lengths_trains_like_eager_without_recompiling():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(-1)
    _check_training(f, [_qkv(2, t, 2, 4) for t in (5, 7, 12, 9)], torch.float32, dynamic=True)
    assert kiln.stats()["recompiles"] == 0, kiln.stats()


def test_a_gpt_block_with_fused_attention_matches_eager_after_steps():
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, dim=16, heads=2):
            super().__init__()
            self.heads, self.ln, self.qkv, self.proj = heads, torch.nn.LayerNorm(dim), \
                torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            return x + self.proj(y.transpose(1, 2).reshape(b, t, c))

    model, ref = Block(), Block()
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    # SGD: the key bias's gradient is zero in exact arithmetic, and Adam would blow its rounding
    # noise (different in any two implementations) up to full steps
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    for step in range(4):
        x = torch.randn(2, 7, 16)
        for m, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-4, atol=1e-5, msg=name)


CUDA_BACKENDS = ["cudnn", "flash", "efficient"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_each_cuda_kernel_trains_like_eager_with_metas_verified(backend, dtype):
    """The kernel is whatever torch picks at compile time; sdpa_kernel narrows the pick. The
    meta verifier compares every node's meta (the saved log-sum-exp's shape and strides, the
    random state's device) with the real tensors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    pick = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    q, k, v = _qkv(2, 37, 2, 64, dtype, "cuda")  # a length no kernel tile divides
    with sdpa_kernel([pick]):
        if attention.choose_backend(*(TensorMeta.of(t) for t in (q, k, v)), None, True, None) != backend:
            pytest.skip(f"torch does not run {backend} attention for these inputs here")

        def f(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with kiln.config.patch(verify=True):
            _check_training(f, [(q, k, v), _qkv(2, 37, 2, 64, dtype, "cuda")], dtype)


def test_gpt_attention_runs_on_views_of_the_projection_and_copies_nothing(monkeypatch):
    """q, k, v are views of the qkv projection (the bias rides in the GEMM), the fused kernel
    reads them in place, and its results have exactly the layouts the metas promised: the
    wrapper's layout check never copies, forward or backward."""
    from kiln.inductor.codegen import wrapper
    copies = []
    real = wrapper.ensure_layout

    def spy(t, shape, stride):
        if t.stride() != tuple(stride) and t.numel() > 1:
            copies.append((tuple(t.shape), t.stride(), stride))
        return real(t, shape, stride)
    monkeypatch.setattr(wrapper, "ensure_layout", spy)
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    qkv = torch.nn.Linear(32, 96).to(dev)

    def attend(x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, 4, c // 4).transpose(1, 2) for z in qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, c)

    x = torch.randn(2, 9, 32, device=dev, requires_grad=True)
    ex = kiln.explain(attend)(x)
    got = kiln.compile(attend)(x)
    got.square().sum().backward()
    gx = x.grad.clone()
    x.grad = None
    want = attend(x)
    want.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-5)
    assert copies == [], copies
    assert ex.kernel_count == 0, ex.kernel_count  # addmm, then attention: nothing to fuse


def test_at_dynamic_lengths_the_layouts_still_match_without_copies(monkeypatch):
    from kiln.inductor.codegen import wrapper
    copies = []
    real = wrapper.ensure_layout

    def spy(t, shape, stride):
        if t.stride() != tuple(stride) and t.numel() > 1:
            copies.append((tuple(t.shape), t.stride(), stride))
        return real(t, shape, stride)
    monkeypatch.setattr(wrapper, "ensure_layout", spy)
    qkv = torch.nn.Linear(32, 96)

    def attend(x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, 4, c // 4).transpose(1, 2) for z in qkv(x).split(c, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)

    g = kiln.compile(attend, dynamic=True)
    for t in (5, 9, 12):
        x = torch.randn(2, t, 32, requires_grad=True)
        got = g(x)
        got.square().sum().backward()
        gx, x.grad = x.grad, None
        want = attend(x)
        want.square().sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-5)
    stats = kiln.stats()
    assert copies == [] and stats["recompiles"] == 0 and stats["eager_runs"] == 0, (copies, stats)
