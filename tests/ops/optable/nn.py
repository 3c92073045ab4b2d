"""Neural-network entries: matmul family and einsum, normalizations, softmax/log_softmax,
dropout (eval and training: masks checked by their statistics), activations, embedding, losses, sdpa, convolution, pooling and interpolate."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import F32, FLOATS, BadInput, OpEntry, rand, tr

LIB_TOL = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2)}  # library GEMMs round differently


def mk(*shapes, layouts=None):
    """Sample maker: one sample of random tensors of these shapes (and a transposed variant)."""
    def make(dtype, device):
        first = tuple(rand(s, dtype, device) for s in shapes)
        second = tuple(tr(s, dtype, device) if len(s) >= 2 else rand(s, dtype, device) for s in shapes)
        return [first, second]
    return make


def targets(n, c, device, ignore=True):
    t = torch.randint(0, c, (n,), device=device)
    if ignore:
        t[1] = -100
    return t


def N(name, fn, samples, dtypes=F32, **kw):
    return OpEntry(name, fn, samples, dtypes, **kw)


def _bn(dtype, device):
    return [(rand((2, 4, 3, 3), dtype, device), rand((4,), dtype, device), rand((4,), dtype, device, low=0.5, high=1.5),
             rand((4,), dtype, device), rand((4,), dtype, device))]


def _einsum_patterns(a, b):
    """Contractions over both batch and row letters, implicit output, ellipsis with broadcast,
    transposed operand letters, three operands, outer product, full contraction, transpose."""
    c = b.transpose(1, 2)
    return (torch.einsum("bij,bjk->ik", a, b), torch.einsum("bij,bjk", a, b),
            torch.einsum("...ij,...jk->...ik", a[:1], b), torch.einsum("bij,bkj->bik", a, c),
            torch.einsum("bij,bjk,bkl->bil", a, b, c), torch.einsum("i,j->ij", a[0, 0], b[1, :, 2]),
            torch.einsum("ij,ij->", a[0], a[1]), torch.einsum("bij->jbi", a) * 2,
            torch.einsum("bij,bj->bi", a, b[:, :, 0]), torch.einsum("bi,bj->bij", a[:, 0], b[:, 0]))


def _bn_running(x, m, v, w, b):
    """Training batch norm updating running statistics (copies: eager runs first on the same
    arguments, so it must not change them)."""
    m, v = m.clone(), v.clone()
    return F.batch_norm(x, m, v, w, b, training=True, momentum=0.2), m, v


def _dropout_samples(dtype, device):
    big = tr((64, 64), dtype, device)
    return [(rand((6, 10), dtype, device), 0.0), (big, 1.0), (big, 0.3), (rand((64, 64), dtype, device), 0.75),
            (rand((0, 4), dtype, device), 0.5)]


def _dropout_compare(actual, expected):
    """Masks are random: p=0 keeps x and p=1 zeroes it exactly; otherwise every output is 0 or
    x / (1 - p) (in x's dtype, as eager scales), and the dropped fraction is within 6 standard
    deviations of p."""
    out, x, p = actual
    assert p == expected[2] and torch.equal(x, expected[1])
    assert out.dtype == expected[0].dtype and out.shape == expected[0].shape
    if p == 0:
        assert torch.equal(out, x)
        return
    if p == 1:
        assert torch.equal(out, torch.zeros_like(x))
        return
    scaled = x * (1.0 / (1.0 - p))
    kept = out != 0
    torch.testing.assert_close(out[kept], scaled[kept], rtol=1e-2 if x.dtype != torch.float32 else 1e-6, atol=0)
    n = int((x != 0).sum())
    if n:
        dropped = float(((out == 0) & (x != 0)).sum()) / n
        assert abs(dropped - p) <= 6 * (p * (1 - p) / n) ** 0.5, f"dropped {dropped:.3f} of {n}, p={p}"


ACT = lambda dtype, device: [(tr((6, 10), dtype, device) * 3,), (rand((0, 4), dtype, device),)]  # noqa: E731
IMG = lambda dtype, device: [(rand((2, 3, 7, 9), dtype, device),), (tr((1, 2, 8, 6), dtype, device),)]  # noqa: E731

ENTRIES = [
    # ---- matmul family
    N("mm", lambda a, b: torch.mm(a, b), mk((3, 4), (4, 5)), FLOATS[:1] + FLOATS[2:], tol=LIB_TOL, differentiable=True),
    N("matmul_batched", lambda a, b: a @ b, mk((2, 3, 4, 5), (3, 5, 2)), FLOATS[:1] + FLOATS[2:], tol=LIB_TOL, differentiable=True),
    N("matmul_vec", lambda a, b: torch.matmul(a, b[0]) + torch.matmul(b[0], a.transpose(-1, -2)).sum(),
      mk((3, 4, 5), (5, 5)), differentiable=True),
    N("bmm_epilogue", lambda a, b: torch.relu(torch.bmm(a, b)) * 0.5, mk((2, 3, 4), (2, 4, 5)), differentiable=True),
    N("addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), mk((5,), (3, 4), (4, 5)), differentiable=True),
    N("addmm_bias", lambda c, a, b: torch.addmm(c, a, b), mk((5,), (3, 4), (4, 5)), differentiable=True),  # HF Conv1D
    N("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=1, alpha=0.5), mk((1, 3, 5), (2, 3, 4), (2, 4, 5)),
      differentiable=True),
    N("linear", lambda x, w, b: F.linear(x, w, b) + F.linear(x, w), mk((2, 3, 4), (5, 4), (5,)), differentiable=True),
    N("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b) + torch.einsum("bij->bj", a).sum(),
      mk((2, 3, 4), (2, 4, 5)), FLOATS[:1] + FLOATS[2:], tol=LIB_TOL, differentiable=True),
    N("einsum_patterns", _einsum_patterns, mk((2, 3, 4), (2, 4, 5)), FLOATS[:1] + FLOATS[2:], tol=LIB_TOL,
      differentiable=True),
    # ---- normalizations
    N("layer_norm", lambda x, w, b: F.layer_norm(x, (12,), w, b), mk((5, 12), (12,), (12,)), FLOATS, differentiable=True),
    N("layer_norm_2d", lambda x: F.layer_norm(x, (3, 4)), mk((2, 3, 4)), FLOATS, differentiable=True),
    N("rms_norm", lambda x, w: F.rms_norm(x, (12,), w, 1e-6), mk((5, 12), (12,)), FLOATS, differentiable=True),
    N("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), mk((2, 4, 3, 3), (4,), (4,)), differentiable=True),
    N("batch_norm_eval", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b), _bn, differentiable=True,
      nograd=(1, 2)),
    N("batch_norm_train", lambda x, m, v, w, b: F.batch_norm(x, None, None, w, b, training=True), _bn, differentiable=True),
    N("batch_norm_running_stats", _bn_running, _bn, FLOATS[:1] + FLOATS[2:], differentiable=True, nograd=(1, 2)),
    # ---- softmax, dropout, activations
    N("softmax", lambda x: torch.softmax(x, -1) + x.softmax(0), ACT, FLOATS, differentiable=True),
    N("log_softmax", lambda x: F.log_softmax(x, dim=-1), ACT, FLOATS, differentiable=True),
    N("softmax_dtype", lambda x: torch.softmax(x, -1, dtype=torch.float32), ACT, (torch.float16,)),
    N("dropout_eval", lambda x: F.dropout(x, 0.5, training=False) * 2, ACT, FLOATS),
    N("dropout_train", lambda x, p: (F.dropout(x, p, training=True), x * 1, p), _dropout_samples, FLOATS,
      compare=_dropout_compare),
    N("gelu", lambda x: F.gelu(x) + F.gelu(x, approximate="tanh"), ACT, FLOATS, differentiable=True),
    N("silu_mish", lambda x: F.silu(x) + F.mish(x), ACT, FLOATS, differentiable=True),
    N("relu_relu6", lambda x: F.relu(x) + F.relu6(x * 4) + F.hardtanh(x, -0.5, 0.75), ACT, FLOATS, differentiable=True),
    N("leaky_relu_elu", lambda x: F.leaky_relu(x) + F.leaky_relu(x, 0.2) + F.elu(x) + F.elu(x, alpha=0.5), ACT, FLOATS,
      differentiable=True),
    N("hardswish_hardsigmoid", lambda x: F.hardswish(x * 4) + F.hardsigmoid(x * 4), ACT, FLOATS, differentiable=True),
    N("softplus", lambda x: F.softplus(x) + F.softplus(x * 10, beta=2, threshold=5), ACT, FLOATS, differentiable=True),
    N("tanh_sigmoid", lambda x: F.tanh(x) + F.sigmoid(x), ACT, FLOATS, differentiable=True),
    # ---- embedding and losses
    N("embedding", lambda w, i: F.embedding(i, w) * 2,
      lambda dt, dev: [(rand((7, 4), dt, dev), torch.randint(0, 7, (2, 3), device=dev))], FLOATS, differentiable=True),
    N("cross_entropy", lambda x, t: F.cross_entropy(x, t),
      lambda dt, dev: [(rand((6, 10), dt, dev), targets(6, 10, dev))], FLOATS, differentiable=True),
    N("cross_entropy_smooth", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, reduction="sum"),
      lambda dt, dev: [(rand((6, 10), dt, dev), targets(6, 10, dev))], differentiable=True),
    N("cross_entropy_3d_none", lambda x, t: F.cross_entropy(x, t, reduction="none"),
      lambda dt, dev: [(rand((2, 5, 3), dt, dev), torch.randint(0, 5, (2, 3), device=dev))], differentiable=True),
    N("cross_entropy_probs", lambda x, p: F.cross_entropy(x, p),
      lambda dt, dev: [(rand((4, 6), dt, dev), torch.rand(4, 6, device=dev).softmax(-1).to(dt))], differentiable=True),
    N("nll_weighted", lambda x, t, w: F.nll_loss(x.log_softmax(-1), t, weight=w),
      lambda dt, dev: [(rand((6, 10), dt, dev), targets(6, 10, dev), torch.rand(10, device=dev).to(dt))], differentiable=True,
      nograd=(2,)),
    N("mse", lambda a, b: F.mse_loss(a, b) + F.mse_loss(a, b, reduction="sum"), mk((4, 5), (4, 5)), FLOATS, differentiable=True),
    N("l1_none", lambda a, b: F.l1_loss(a, b, reduction="none"), mk((4, 5), (5,)), differentiable=True),
    N("bce_logits", lambda a, b: F.binary_cross_entropy_with_logits(a * 10, b.sigmoid()), mk((4, 5), (4, 5)),
      differentiable=True),
    # ---- attention, convolution, pooling, interpolate
    N("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
      mk((2, 2, 8, 4), (2, 2, 8, 4), (2, 2, 8, 4)), differentiable=True),
    N("sdpa_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m > -0.5),
      mk((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), (5, 5)), differentiable=True),
    N("conv2d_relu", lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1, stride=2)),
      mk((1, 3, 8, 8), (4, 3, 3, 3), (4,)), differentiable=True),
    N("conv1d", lambda x, w: F.conv1d(x, w, groups=2), mk((2, 4, 9), (6, 2, 3)), differentiable=True),
    N("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1) + F.max_pool2d(x, 2).sum(), IMG, FLOATS, differentiable=True),
    N("avg_pool2d", lambda x: F.avg_pool2d(x, 2).sum() + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), IMG, FLOATS,
      differentiable=True),
    N("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 4)).sum() + F.adaptive_avg_pool2d(x, 1).sum()
      + F.adaptive_avg_pool2d(x, (2, None)), IMG, FLOATS, differentiable=True),
    N("interpolate_nearest", lambda x: F.interpolate(x, size=(5, 13)).sum() + F.interpolate(x, scale_factor=2), IMG, FLOATS,
      differentiable=True),
    N("interpolate_bilinear", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear").sum()
      + F.interpolate(x, size=(4, 5), mode="bilinear", align_corners=True), IMG, FLOATS, differentiable=True),
]

BAD = [
    BadInput("mm_shape_mismatch", lambda a, b: torch.mm(a, b), lambda: (torch.randn(3, 4), torch.randn(5, 2))),
    BadInput("linear_shape_mismatch", lambda x, w: F.linear(x, w), lambda: (torch.randn(3, 4), torch.randn(5, 3))),
    BadInput("softmax_bad_dim", lambda x: torch.softmax(x, 3), lambda: (torch.randn(3, 4),)),
    BadInput("layer_norm_bad_shape", lambda x: F.layer_norm(x, (5,)), lambda: (torch.randn(3, 4),)),
    BadInput("max_pool_too_small", lambda x: F.max_pool2d(x, 5), lambda: (torch.randn(1, 1, 3, 3),)),
]
