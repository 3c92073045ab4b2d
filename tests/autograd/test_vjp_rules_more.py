"""Generated gradient test for the core ops of core_elementwise_more, core_shape, core_nn and
core_scatter: kiln's forward and input grads match eager autograd (backends aot_eager and kiln,
strict mode, float32 and float64, broadcast cases where meaningful)."""
from __future__ import annotations

import zlib

import pytest
import torch

from kiln.ops import core
from kiln.ops.registry import VJP_RULES

from autograd_helpers import check_grads


def rnd(*shape):
    return lambda dtype: torch.randn(shape).to(dtype).requires_grad_()


def pos(*shape):
    return lambda dtype: (torch.rand(shape) + 0.5).to(dtype).requires_grad_()


def away(*shape):  # |x| >= 0.25 and off the kinks at +-1, +-3, 0
    def make(dtype):
        t = torch.randn(shape) * 2
        t = torch.where(t.abs() < 0.25, t.sign() * 0.3 + 0.01, t)
        t = torch.where((t.abs() - 1).abs() < 0.05, t * 1.1, t)
        t = torch.where((t.abs() - 3).abs() < 0.05, t * 1.1, t)
        return t.to(dtype).requires_grad_()
    return make


def const(t):  # an input that does not require grad (indices, masks, targets)
    return lambda dtype: t


def nograd(maker):
    return lambda dtype: maker(dtype).detach()


def idx(high, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return const(torch.randint(0, high, shape, generator=g))


def bool_mask(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return const(torch.rand(shape, generator=g) > 0.4)


def causal_ok_mask(n, s):
    m = torch.rand(n, s, generator=torch.Generator().manual_seed(3)) > 0.3
    m[:, 0] = True  # no fully masked row
    return const(m)


def with_special(*shape):
    def make(dtype):
        t = torch.randn(shape)
        t[0, 0], t[0, 1], t[1, 0] = float("nan"), float("inf"), -float("inf")
        return t.to(dtype).requires_grad_()
    return make


CE_TARGET = torch.tensor([1, 0, 4, -100, 2, 3])
GATHER_INDEX = torch.randint(0, 4, (3, 5), generator=torch.Generator().manual_seed(5))

ELEMENTWISE = [
    ("floor", lambda a: core.floor(a), [rnd(3, 4)]),
    ("ceil", lambda a: core.ceil(a), [rnd(3, 4)]),
    ("trunc", lambda a: core.trunc(a), [rnd(3, 4)]),
    ("round", lambda a: core.round(a), [rnd(3, 4)]),
    ("round_decimals", lambda a: core.round(a, 2), [rnd(3, 4)]),
    ("sign", lambda a: core.sign(a), [rnd(3, 4)]),
    ("reciprocal", lambda a: core.reciprocal(a), [pos(3, 4)]),
    ("exp2", lambda a: core.exp2(a), [rnd(3, 4)]),
    ("expm1", lambda a: core.expm1(a), [rnd(3, 4)]),
    ("log2", lambda a: core.log2(a), [pos(3, 4)]),
    ("log10", lambda a: core.log10(a), [pos(3, 4)]),
    ("log1p", lambda a: core.log1p(a), [pos(3, 4)]),
    ("sin", lambda a: core.sin(a), [rnd(3, 4)]),
    ("cos", lambda a: core.cos(a), [rnd(3, 4)]),
    ("erf", lambda a: core.erf(a), [rnd(3, 4)]),
    ("pow_scalar", lambda a: core.pow(a, 3.0), [rnd(3, 4)]),
    ("pow_frac", lambda a: core.pow(a, 2.5), [pos(3, 4)]),
    ("pow_zero", lambda a: core.pow(a, 0.0), [rnd(3, 4)]),
    ("pow_tensor", lambda a, b: core.pow(a, b), [pos(3, 4), rnd(3, 4)]),
    ("pow_tensor_bcast", lambda a, b: core.pow(a, b), [pos(3, 4), rnd(4)]),
    ("pow_scalar_base", lambda b: core.pow(2.0, b), [rnd(3, 4)]),
    ("fmod", lambda a, b: core.fmod(a, b), [rnd(3, 4), pos(3, 4)]),
    ("remainder", lambda a, b: core.remainder(a, b), [rnd(3, 4), pos(3, 4)]),
    ("clamp", lambda a: core.clamp(a, -0.5, 0.5), [rnd(3, 4)]),
    ("clamp_min", lambda a: core.clamp(a, 0.1), [rnd(3, 4)]),
    ("clamp_max", lambda a: core.clamp(a, None, 0.2), [rnd(3, 4)]),
    ("clamp_tensor", lambda a, lo, hi: core.clamp(a, lo, hi), [rnd(3, 4), rnd(4), rnd(3, 1)]),
    ("lerp", lambda a, b: core.lerp(a, b, 0.3), [rnd(3, 4), rnd(3, 4)]),
    ("lerp_tensor", lambda a, b, w: core.lerp(a, b, w), [rnd(3, 4), rnd(4), rnd(3, 4)]),
    ("addcmul", lambda x, a, b: core.addcmul(x, a, b, value=0.5), [rnd(3, 4), rnd(3, 4), rnd(4)]),
    ("addcdiv", lambda x, a, b: core.addcdiv(x, a, b, value=2.0), [rnd(3, 4), rnd(3, 4), pos(3, 4)]),
    ("masked_fill", lambda x, m: core.masked_fill(x, m, -1.0), [rnd(3, 4), bool_mask(3, 4)]),
    ("masked_fill_bcast", lambda x, m: core.masked_fill(x, m, 2.0), [rnd(3, 4), bool_mask(4)]),
    ("nan_to_num", lambda x: core.nan_to_num(x), [with_special(3, 4)]),
    ("gelu", lambda a: core.gelu(a), [rnd(3, 4)]),
    ("gelu_tanh", lambda a: core.gelu(a, "tanh"), [rnd(3, 4)]),
    ("silu", lambda a: core.silu(a), [rnd(3, 4)]),
    ("hardtanh", lambda a: core.hardtanh(a), [away(3, 4)]),
    ("relu6", lambda a: core.hardtanh(a, 0.0, 6.0), [lambda d: (torch.randn(3, 4) * 5).to(d).requires_grad_()]),
    ("leaky_relu", lambda a: core.leaky_relu(a, 0.2), [away(3, 4)]),
    ("elu", lambda a: core.elu(a, 1.5), [away(3, 4)]),
    ("hardswish", lambda a: core.hardswish(a), [away(4, 5)]),
    ("hardsigmoid", lambda a: core.hardsigmoid(a), [away(4, 5)]),
    ("mish", lambda a: core.mish(a), [rnd(3, 4)]),
    ("softplus", lambda a: core.softplus(a), [rnd(3, 4)]),
    ("softplus_beta", lambda a: core.softplus(a, 2.0, 1.0), [rnd(3, 4)]),
]

SHAPE = [
    ("slice", lambda a: core.slice(a, 1, 1, 3), [rnd(3, 4)]),
    ("slice_step", lambda a: core.slice(a, 0, 1, None, 2), [rnd(6, 4)]),
    ("slice_step_uneven", lambda a: core.slice(a, -1, 0, 6, 3), [rnd(2, 7)]),
    ("select", lambda a: core.select(a, 1, -1), [rnd(3, 4)]),
    ("cat", lambda a, b: core.cat([a, b], 1), [rnd(3, 2), rnd(3, 4)]),
    ("cat_same_input", lambda a: core.cat([a, core.mul(a, 2.0), a], 0), [rnd(2, 3)]),
    ("stack", lambda a, b: core.cat([core.unsqueeze(a, 0), core.unsqueeze(b, 0)], 0), [rnd(3, 4), rnd(3, 4)]),
    ("split", lambda a: (core.slice(a, 0, 0, 2), core.mul(core.slice(a, 0, 2, 5), 3.0)), [rnd(5, 3)]),
    ("unbind", lambda a: tuple(core.select(a, 1, i) for i in range(3)), [rnd(2, 3)]),
    ("flip", lambda a: core.flip(a, (0, 1)), [rnd(3, 4)]),
    ("roll", lambda a: core.roll(a, (1, -2), (0, 1)), [rnd(3, 4)]),
    ("roll_flat", lambda a: core.roll(a, 5), [rnd(3, 4)]),
    ("tril", lambda a: core.tril(a), [rnd(4, 4)]),
    ("triu", lambda a: core.triu(a, 1), [rnd(2, 3, 4)]),
    ("repeat", lambda a: core.repeat(a, (2, 3)), [rnd(3, 4)]),
    ("repeat_lead", lambda a: core.repeat(a, (2, 1, 2)), [rnd(3, 4)]),
    ("pad", lambda a: core.constant_pad(a, (1, 2), 0.5), [rnd(3, 4)]),
    ("pad_2d_neg", lambda a: core.constant_pad(a, (1, -1, -1, 2), 0.0), [rnd(3, 4)]),
    ("max_dim_ties", lambda a: core.max_dim(a, 1)[0], [lambda d: torch.randint(0, 3, (4, 5)).to(d).requires_grad_()]),
    ("min_dim_ties_keepdim", lambda a: core.min_dim(a, 0, True)[0], [lambda d: torch.randint(0, 3, (4, 5)).to(d).requires_grad_()]),
    ("flatten", lambda a: core.reshape(a, (2, 12)), [rnd(2, 3, 4)]),
]

NN = [
    ("matmul_2d", lambda a, b: core.matmul(a, b), [rnd(3, 4), rnd(4, 5)]),
    ("matmul_3d_2d", lambda a, b: core.matmul(a, b), [rnd(2, 3, 4), rnd(4, 5)]),
    ("matmul_bcast", lambda a, b: core.matmul(a, b), [rnd(2, 1, 3, 4), rnd(3, 4, 5)]),
    ("matmul_1d_1d", lambda a, b: core.matmul(a, b), [rnd(4), rnd(4)]),
    ("matmul_1d_3d", lambda a, b: core.matmul(a, b), [rnd(4), rnd(2, 4, 5)]),
    ("matmul_3d_1d", lambda a, b: core.matmul(a, b), [rnd(2, 3, 4), rnd(4)]),
    ("bmm", lambda a, b: core.bmm(a, b), [rnd(2, 3, 4), rnd(2, 4, 5)]),
    ("addmm", lambda c, a, b: core.addmm(c, a, b, 0.5, 2.0), [rnd(5), rnd(3, 4), rnd(4, 5)]),
    ("addmm_beta0", lambda c, a, b: core.addmm(c, a, b, 0, 1), [rnd(3, 5), rnd(3, 4), rnd(4, 5)]),
    ("baddbmm", lambda c, a, b: core.baddbmm(c, a, b, 1, 0.5), [rnd(1, 3, 5), rnd(2, 3, 4), rnd(2, 4, 5)]),
    ("layer_norm", lambda x, w, b: core.layer_norm(x, (8,), w, b, 1e-5), [rnd(2, 3, 8), rnd(8), rnd(8)]),
    ("layer_norm_2d_noaffine", lambda x: core.layer_norm(x, (3, 8)), [rnd(2, 3, 8)]),
    ("rms_norm", lambda x, w: core.rms_norm(x, (8,), w, 1e-6), [rnd(2, 3, 8), rnd(8)]),
    ("rms_norm_noeps", lambda x: core.rms_norm(x, (8,)), [rnd(4, 8)]),
    ("group_norm", lambda x, w, b: core.group_norm(x, 2, w, b, 1e-5), [rnd(2, 4, 3, 3), rnd(4), rnd(4)]),
    ("batch_norm_eval", lambda x, m, v, w, b: core.batch_norm(x, m, v, w, b, False),
     [rnd(4, 3, 5), nograd(rnd(3)), nograd(pos(3)), rnd(3), rnd(3)]),
    ("batch_norm_train", lambda x, w, b: core.batch_norm(x, None, None, w, b, True),
     [rnd(4, 3, 5), rnd(3), rnd(3)]),
    ("embedding", lambda w, i: core.embedding(w, i), [rnd(10, 4), idx(10, 2, 5)]),
    ("index_select", lambda x, i: core.index_select(x, 1, i), [rnd(3, 5), const(torch.tensor([4, 0, 4, 2]))]),
    ("gather", lambda x, i: core.gather(x, 1, i), [rnd(3, 4), const(GATHER_INDEX)]),
    ("scatter_add", lambda x, i, s: core.scatter_add(x, 1, i, s), [rnd(3, 4), const(GATHER_INDEX), rnd(3, 5)]),
    ("index_add", lambda x, i, s: core.index_add(x, 0, i, s, 2.0), [rnd(5, 3), const(torch.tensor([4, 0, 4])), rnd(3, 3)]),
    ("cross_entropy", lambda x, t: core.cross_entropy(x, t), [rnd(6, 5), const(CE_TARGET.clamp(min=0))]),
    ("cross_entropy_ignore_smooth", lambda x, t: core.cross_entropy(x, t, None, -100, "mean", 0.1),
     [rnd(6, 5), const(CE_TARGET)]),
    ("cross_entropy_sum_weight", lambda x, t, w: core.cross_entropy(x, t, w, -100, "sum"),
     [rnd(6, 5), const(CE_TARGET), nograd(pos(5))]),
    ("cross_entropy_none_4d", lambda x, t: core.cross_entropy(x, t, None, 1, "none"),
     [rnd(2, 5, 3, 2), idx(5, 2, 3, 2)]),
    ("cross_entropy_probs", lambda x, t: core.cross_entropy(x, t, None, -100, "mean", 0.2),
     [rnd(4, 5), lambda d: torch.softmax(torch.randn(4, 5), -1).to(d)]),
    ("cross_entropy_probs_grad", lambda x, t: core.cross_entropy(x, t), [rnd(4, 5), rnd(4, 5)]),
    ("nll_loss", lambda x, t: core.nll_loss(x, t), [rnd(6, 5), const(CE_TARGET)]),
    ("nll_loss_weight_none", lambda x, t, w: core.nll_loss(x, t, w, -100, "none"),
     [rnd(6, 5), const(CE_TARGET), nograd(pos(5))]),
    ("mse_loss", lambda a, b: core.mse_loss(a, b), [rnd(3, 4), rnd(3, 4)]),
    ("mse_loss_bcast_sum", lambda a, b: core.mse_loss(a, b, "sum"), [rnd(3, 4), rnd(4)]),
    ("l1_loss", lambda a, b: core.l1_loss(a, b, "none"), [rnd(3, 4), rnd(3, 4)]),
    ("bce_with_logits", lambda a, b: core.bce_with_logits(a, b), [rnd(3, 4), lambda d: torch.rand(3, 4).to(d).requires_grad_()]),
    ("sdpa", lambda q, k, v: core.sdpa(q, k, v), [rnd(2, 2, 5, 4), rnd(2, 2, 6, 4), rnd(2, 2, 6, 3)]),
    ("sdpa_causal_scale", lambda q, k, v: core.sdpa(q, k, v, None, 0.0, True, 0.3),
     [rnd(2, 5, 4), rnd(2, 5, 4), rnd(2, 5, 4)]),
    ("sdpa_bool_mask", lambda q, k, v, m: core.sdpa(q, k, v, m),
     [rnd(2, 4, 4), rnd(2, 6, 4), rnd(2, 6, 4), causal_ok_mask(4, 6)]),
    ("sdpa_bool_mask_fused", lambda q, k, v, m: core.sdpa(q, k, v, m),   # torch's fused backward
     [rnd(2, 2, 6, 4), rnd(2, 2, 6, 4), rnd(2, 2, 6, 4), causal_ok_mask(6, 6)]),
    ("sdpa_float_mask", lambda q, k, v, m: core.sdpa(q, k, v, m),
     [rnd(2, 4, 4), rnd(2, 6, 4), rnd(2, 6, 4), rnd(4, 6)]),
    ("conv1d", lambda x, w, b: core.conv(x, w, b, (1,), (1,), (1,), 1), [rnd(2, 3, 8), rnd(4, 3, 3), rnd(4)]),
    ("conv1d_stride_dil", lambda x, w: core.conv(x, w, None, (2,), (2,), (2,), 1), [rnd(2, 3, 9), rnd(4, 3, 3)]),
    ("conv2d", lambda x, w, b: core.conv(x, w, b, (1, 1), (1, 0), (1, 1), 1), [rnd(2, 3, 5, 6), rnd(4, 3, 3, 2), rnd(4)]),
    ("conv2d_stride_groups", lambda x, w: core.conv(x, w, None, (2, 3), (1, 1), (1, 2), 2),
     [rnd(2, 4, 7, 8), rnd(6, 2, 3, 2)]),
]

OPS = ELEMENTWISE + SHAPE + NN
BACKENDS = ["aot_eager", "kiln"]
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name,fn,makers", OPS, ids=[o[0] for o in OPS])
def test_op_grad_matches_eager(name, fn, makers, dtype, backend):
    torch.manual_seed(zlib.crc32(name.encode()))
    inputs = [m(dtype) for m in makers]
    check_grads(fn, inputs, backend, dtype)


def test_every_differentiable_core_op_has_a_rule():
    import kiln.autograd  # noqa: F401  (importing the stage registers every rule)
    from kiln.ops.registry import all_ops
    # ``differentiable=False`` on an op's define: comparisons, predicates, integer and creation
    # ops, the backward ops themselves (no double backward through compiled graphs) and
    # mutating custom ops; fallbacks replay torch's autograd (ops/core_fallback.py)
    non_differentiable = {op.name for op in all_ops("core") if not op.differentiable}
    assert {"eq", "argmax", "full", "rand", "conv_backward", "bitwise_left_shift"} <= non_differentiable
    assert "fallback" not in non_differentiable
    missing = [op.name for op in all_ops("core") if op.name not in non_differentiable
               and op not in VJP_RULES]
    assert not missing
