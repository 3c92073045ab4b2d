"""Every elementwise core op, compiled end to end, against eager: generated from one table of
op x dtype x layout x code-generation target, on fresh random inputs."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target, randn

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)

# name -> (function, arity, dtypes); inputs are made valid for the op (e.g. log of |x| + 1)
OPS = {
    "add": (lambda a, b: a + b, 2, FLOATS + INTS),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2), 2, FLOATS + INTS),
    "sub": (lambda a, b: a - b, 2, FLOATS + INTS),
    "sub_alpha": (lambda a, b: a.sub(b, alpha=3), 2, FLOATS),
    "mul": (lambda a, b: a * b, 2, FLOATS + INTS),
    "div": (lambda a, b: a / (b.abs() + 1), 2, FLOATS + INTS),
    "maximum": (lambda a, b: torch.maximum(a, b), 2, FLOATS + INTS),
    "minimum": (lambda a, b: torch.minimum(a, b), 2, FLOATS + INTS),
    "eq": (lambda a, b: a == b, 2, FLOATS + INTS),
    "ne": (lambda a, b: a != b, 2, FLOATS),
    "lt": (lambda a, b: a < b, 2, FLOATS + INTS),
    "le": (lambda a, b: a <= b, 2, FLOATS),
    "gt": (lambda a, b: a > b, 2, FLOATS),
    "ge": (lambda a, b: a >= b, 2, FLOATS + INTS),
    "where": (lambda a, b: torch.where(a > b, a, b * 2), 2, FLOATS + INTS),
    "neg": (lambda a: -a, 1, FLOATS + INTS),
    "abs": (lambda a: torch.abs(a), 1, FLOATS + INTS),
    "relu": (lambda a: torch.relu(a), 1, FLOATS + INTS),
    "exp": (lambda a: torch.exp(a), 1, FLOATS),
    "log": (lambda a: torch.log(a.abs() + 1), 1, FLOATS),
    "sqrt": (lambda a: a.abs().sqrt(), 1, FLOATS),
    "rsqrt": (lambda a: torch.rsqrt(a.abs() + 0.5), 1, FLOATS),
    "tanh": (lambda a: torch.tanh(a), 1, FLOATS),
    "sigmoid": (lambda a: a.sigmoid(), 1, FLOATS),
    "int_to_float": (lambda a: torch.exp(a.abs() * 0.1), 1, INTS),
    "scalar_right": (lambda a: a * 2.5 + 1, 1, FLOATS),
    "scalar_left": (lambda a: 3 - a, 1, FLOATS + INTS),
    "int_tensor_float_scalar": (lambda a: a * 0.5, 1, INTS),
    "to_dtype": (lambda a: a.to(torch.float32) * 2 if a.dtype != torch.float32 else a.half() * 2, 1, FLOATS),
}

LAYOUTS = ("contiguous", "transposed_broadcast")


def _inputs(arity, dtype, device, layout):
    shape = (6, 10)
    if layout == "contiguous":
        return [randn(shape, dtype, device) for _ in range(arity)]
    # first operand a transposed (non-contiguous) view, second a broadcast row
    first = randn(shape, dtype, device, "transposed")
    rest = [randn(shape[-1:], dtype, device) for _ in range(arity - 1)]
    return [first] + rest


CASES = [(name, dtype, layout) for name, (_, _, dtypes) in OPS.items() for dtype in dtypes
         for layout in LAYOUTS]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name,dtype,layout", CASES,
                         ids=[f"{n}-{str(d).split('.')[-1]}-{lay}" for n, d, lay in CASES])
def test_elementwise_op_matches_eager(name, dtype, layout, target):
    fn, arity, _ = OPS[name]
    with on_target(target) as device:
        args = _inputs(arity, dtype, device, layout)
        expected = fn(*args)
        compiled = kiln.compile(fn, fullgraph=True)
        actual = compiled(*args)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert_close(actual, expected)
        # fresh inputs hit the cache and still match
        args2 = _inputs(arity, dtype, device, layout)
        assert_close(compiled(*args2), fn(*args2))
        assert kiln.stats()["cache_hits"] >= 1
        assert kiln.stats()["kernels_generated"] == 1


PROMOTIONS = [
    ("int_plus_float_tensor", lambda a, b: a + b, (torch.int32, torch.float32)),
    ("half_plus_float_tensor", lambda a, b: a + b, (torch.float16, torch.float32)),
    ("bf16_times_zero_dim_float", lambda a, b: a * b, (torch.bfloat16, "zero_dim_f32")),
    ("bool_and_int", lambda a, b: torch.where(a, b, -b), (torch.bool, torch.int64)),
    ("int_div_int", lambda a, b: a / (b.abs() + 1), (torch.int64, torch.int64)),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name,fn,dtypes", PROMOTIONS, ids=[p[0] for p in PROMOTIONS])
def test_type_promotion_matches_eager(name, fn, dtypes, target):
    with on_target(target) as device:
        args = []
        for d in dtypes:
            if d == "zero_dim_f32":
                args.append(torch.tensor(1.75, device=device))
            else:
                args.append(randn((5, 7), d, device))
        expected = fn(*args)
        actual = kiln.compile(fn, fullgraph=True)(*args)
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        assert_close(actual, expected)


def test_nan_propagates_like_eager():
    x = torch.tensor([float("nan"), -1.0, 2.0, float("-inf")])
    fn = lambda a: torch.maximum(torch.relu(a), a * 0.5)  # noqa: E731
    assert_close(kiln.compile(fn)(x), fn(x))
