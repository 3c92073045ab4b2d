"""Generated test: for every differentiable core op, kiln's forward and input grads match eager
autograd (backends aot_eager and kiln; float32 and float64; broadcast cases)."""
from __future__ import annotations

import zlib

import pytest
import torch

from kiln.ops import core
from kiln.ops.registry import VJP_RULES

from autograd_helpers import check_grads


def pos(shape):  # strictly positive inputs for log / sqrt / rsqrt
    return lambda dtype: (torch.rand(shape) + 0.5).to(dtype)


def rnd(shape):
    return lambda dtype: torch.randn(shape).to(dtype)


def with_zeros(shape):
    def make(dtype):
        t = torch.randn(shape).to(dtype)
        t[0, 1] = 0.0          # one zero in row 0
        t[1, 0] = t[1, 2] = 0  # two zeros in row 1
        return t
    return make


def ties(shape):  # repeated extremes (amax/amin split the grad among ties, like eager)
    return lambda dtype: torch.randint(0, 3, shape).to(dtype)


# (id, fn, input makers, grad for each input?)
OPS = [
    ("add", lambda a, b: core.add(a, b), [rnd((3, 4)), rnd((3, 4))]),
    ("add_alpha", lambda a, b: core.add(a, b, alpha=2.5), [rnd((3, 4)), rnd((3, 4))]),
    ("add_scalar", lambda a: core.add(a, 3.0), [rnd((3, 4))]),
    ("sub", lambda a, b: core.sub(a, b), [rnd((3, 4)), rnd((3, 4))]),
    ("sub_alpha", lambda a, b: core.sub(a, b, alpha=-0.5), [rnd((3, 4)), rnd((3, 4))]),
    ("mul", lambda a, b: core.mul(a, b), [rnd((3, 4)), rnd((3, 4))]),
    ("mul_scalar", lambda a: core.mul(a, -1.5), [rnd((3, 4))]),
    ("div", lambda a, b: core.div(a, b), [rnd((3, 4)), pos((3, 4))]),
    ("neg", lambda a: core.neg(a), [rnd((3, 4))]),
    ("abs", lambda a: core.abs(a), [rnd((3, 4))]),
    ("relu", lambda a: core.relu(a), [rnd((3, 4))]),
    ("exp", lambda a: core.exp(a), [rnd((3, 4))]),
    ("log", lambda a: core.log(a), [pos((3, 4))]),
    ("sqrt", lambda a: core.sqrt(a), [pos((3, 4))]),
    ("rsqrt", lambda a: core.rsqrt(a), [pos((3, 4))]),
    ("tanh", lambda a: core.tanh(a), [rnd((3, 4))]),
    ("sigmoid", lambda a: core.sigmoid(a), [rnd((3, 4))]),
    ("maximum", lambda a, b: core.maximum(a, b), [rnd((3, 4)), rnd((3, 4))]),
    ("minimum", lambda a, b: core.minimum(a, b), [rnd((3, 4)), rnd((3, 4))]),
    ("maximum_ties", lambda a, b: core.maximum(a, b), [ties((3, 4)), ties((3, 4))]),
    ("where", lambda a, b: core.where(core.gt(a, 0), a, b), [rnd((3, 4)), rnd((3, 4))]),
    ("where_scalar", lambda a: core.where(core.lt(a, 0.2), a, 0.0), [rnd((3, 4))]),
    ("to_dtype", lambda a: core.mul(core.to_dtype(a, torch.float16), 2.0), [rnd((3, 4))]),
    ("to_dtype_up", lambda a: core.to_dtype(a, torch.float64), [rnd((3, 4))]),
    # broadcasting: grads are summed back to each input's shape
    ("add_bcast", lambda a, b: core.add(a, b), [rnd((3, 4)), rnd((4,))]),
    ("mul_bcast", lambda a, b: core.mul(a, b), [rnd((3, 1)), rnd((1, 4))]),
    ("div_bcast", lambda a, b: core.div(a, b), [rnd((2, 3, 4)), pos((3, 1))]),
    ("maximum_bcast", lambda a, b: core.maximum(a, b), [rnd((3, 4)), rnd((4,))]),
    ("where_bcast", lambda a, b: core.where(core.gt(a, 0), a, b), [rnd((3, 4)), rnd((1, 4))]),
    ("sub_0d", lambda a, b: core.sub(a, b), [rnd((3, 4)), rnd(())]),
    # views
    ("reshape", lambda a: core.mul(core.reshape(a, (2, 6)), 1.0), [rnd((3, 4))]),
    ("reshape_flat", lambda a: core.reshape(a, (-1,)), [rnd((3, 4))]),
    ("permute", lambda a: core.permute(a, (2, 0, 1)), [rnd((2, 3, 4))]),
    ("transpose", lambda a: core.contiguous(core.transpose(a, 0, -1)), [rnd((2, 3, 4))]),
    ("expand", lambda a: core.expand(a, (2, 3, 4)), [rnd((3, 1))]),
    ("unsqueeze", lambda a: core.unsqueeze(a, 1), [rnd((3, 4))]),
    ("squeeze", lambda a: core.squeeze(a, 1), [rnd((3, 1, 4))]),
    ("squeeze_all", lambda a: core.squeeze(a), [rnd((3, 1, 4, 1))]),
    # reductions
    ("sum", lambda a: core.sum(a), [rnd((3, 4))]),
    ("sum_dim_keepdim", lambda a: core.sum(a, (1,), True), [rnd((2, 3, 4))]),
    ("sum_dims", lambda a: core.sum(a, (0, 2)), [rnd((2, 3, 4))]),
    ("mean", lambda a: core.mean(a, (-1,)), [rnd((3, 4))]),
    ("mean_all", lambda a: core.mean(a), [rnd((3, 4))]),
    ("prod", lambda a: core.prod(a, (1,)), [rnd((3, 4))]),
    ("prod_zeros", lambda a: core.prod(a, (1,)), [with_zeros((3, 4))]),
    ("amax", lambda a: core.amax(a, (1,)), [rnd((3, 4))]),
    ("amin_keepdim", lambda a: core.amin(a, (0,), True), [rnd((3, 4))]),
    ("amax_ties", lambda a: core.amax(a, (1,)), [ties((3, 5))]),
    ("var", lambda a: core.var(a, (1,)), [rnd((3, 4))]),
    ("var_all_c0", lambda a: core.var(a, None, 0), [rnd((3, 4))]),
    ("logsumexp", lambda a: core.logsumexp(a, (1,)), [rnd((3, 4))]),
    ("softmax", lambda a: core.softmax(a, -1), [rnd((3, 4))]),
    ("softmax_dim0", lambda a: core.softmax(a, 0), [rnd((3, 4))]),
    ("log_softmax", lambda a: core.log_softmax(a, 1), [rnd((3, 4))]),
    ("max_dim", lambda a: core.max_dim(a, 1)[0], [rnd((3, 4))]),
    ("min_dim_keepdim", lambda a: core.min_dim(a, 0, True)[0], [rnd((3, 4))]),
    ("max_dim_both_outputs", lambda a: core.max_dim(a, 1), [rnd((3, 4))]),
    # library ops
    ("mm", lambda a, b: core.mm(a, b), [rnd((3, 4)), rnd((4, 5))]),
    ("linear", lambda x, w, b: core.linear(x, w, b), [rnd((3, 4)), rnd((5, 4)), rnd((5,))]),
    ("linear_nobias", lambda x, w: core.linear(x, w), [rnd((3, 4)), rnd((5, 4))]),
    ("linear_3d", lambda x, w, b: core.linear(x, w, b), [rnd((2, 3, 4)), rnd((5, 4)), rnd((5,))]),
    ("linear_1d", lambda x, w, b: core.linear(x, w, b), [rnd((4,)), rnd((5, 4)), rnd((5,))]),
    # grads through chains, with fan-out
    ("chain", lambda a, b: core.mul(core.tanh(core.mul(a, b)), core.sigmoid(a)), [rnd((3, 4)), rnd((4,))]),
]

BACKENDS = ["aot_eager", "kiln"]
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name,fn,makers", OPS, ids=[o[0] for o in OPS])
def test_op_grad_matches_eager(name, fn, makers, dtype, backend):
    torch.manual_seed(zlib.crc32(name.encode()))
    inputs = [m(dtype).requires_grad_() for m in makers]
    check_grads(fn, inputs, backend, dtype)


def test_mixed_dtypes_grad_keeps_input_dtype():
    a = torch.randn(3, 4, dtype=torch.float32, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    check_grads(lambda a, b: core.mul(a, b), [a, b], "aot_eager", torch.float32)


def test_input_without_grad_gets_none():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4)
    check_grads(lambda a, b: core.mul(a, b), [a, b], "aot_eager")


def test_every_differentiable_core_op_has_a_rule():
    non_differentiable = {"eq", "ne", "lt", "le", "gt", "ge", "argmax", "argmin", "any", "all"}
    tested = {"add", "sub", "mul", "div", "neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt",
              "tanh", "sigmoid", "maximum", "minimum", "where", "to_dtype", "reshape", "permute",
              "transpose", "expand", "unsqueeze", "squeeze", "contiguous", "sum", "mean", "prod",
              "amax", "amin", "var", "logsumexp", "softmax", "log_softmax", "max_dim", "min_dim",
              "mm", "linear"}
    for name in tested - non_differentiable:
        assert getattr(core, name) in VJP_RULES, name
