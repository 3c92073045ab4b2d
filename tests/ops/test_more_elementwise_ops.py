"""The elementwise core ops of kiln/ops/core_elementwise_more.py against eager, generated from one
table of op x dtypes. Every entry runs through capture and decomposition (backend aot_eager)
and through the whole compiler on each code-generation target.

Inputs: ``a`` is a transposed (non-contiguous) (6, 10) tensor whose first row holds special
values (NaN, infinities, zeros, rounding ties) for floats, ``b`` a (10,) row that broadcasts,
``c`` a contiguous (6, 10) tensor. To keep C++ builds few, the C++ target compiles each entry
for float32 only, and every other dtype in one batched kernel of all entries.
"""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)
ALL = FLOATS + INTS
BOOL = (torch.bool,)


def nz(b):
    """A divisor without zeros (integers) that keeps its sign."""
    return torch.where(b == 0, b + 3, b) if not b.dtype.is_floating_point else b


# name -> (fn(a, b, c), dtypes)
OPS = {
    "floor": (lambda a, b, c: torch.floor(a), ALL),
    "ceil": (lambda a, b, c: a.ceil(), ALL),
    "trunc": (lambda a, b, c: torch.trunc(a), ALL),
    "round": (lambda a, b, c: torch.round(a * 2), ALL),
    "round_decimals": (lambda a, b, c: torch.round(a, decimals=2), FLOATS),
    "sign": (lambda a, b, c: torch.sign(a), ALL),
    "reciprocal": (lambda a, b, c: torch.reciprocal(a), FLOATS),
    "square": (lambda a, b, c: torch.square(a), ALL),
    "exp2": (lambda a, b, c: torch.exp2(a), FLOATS),
    "expm1": (lambda a, b, c: torch.expm1(a * 0.01) + a.expm1(), FLOATS),
    "log2": (lambda a, b, c: torch.log2(a.abs() + 0.1), FLOATS),
    "log10": (lambda a, b, c: torch.log10(a.abs()), FLOATS),
    "log1p": (lambda a, b, c: torch.log1p(a * 1e-3) + a.abs().log1p(), FLOATS),
    "sin_cos": (lambda a, b, c: torch.sin(a) + torch.cos(b), FLOATS),
    "erf": (lambda a, b, c: torch.erf(a), FLOATS),
    "int_to_float": (lambda a, b, c: torch.sin(a) + torch.log2(b.abs() + 1), INTS),
    "pow_tensor": (lambda a, b, c: torch.pow(a, b), FLOATS),
    "pow_neg_base_int_exp": (lambda a, b, c: torch.pow(-a.abs(), torch.round(b * 2)), FLOATS),
    "pow_2_3": (lambda a, b, c: a ** 2 + a ** 3, FLOATS),
    "pow_sqrt": (lambda a, b, c: a.abs() ** 0.5 - b.abs() ** -0.5, FLOATS),
    "pow_neg": (lambda a, b, c: (a.abs() + 0.5).pow(-2) + (b.abs() + 0.5) ** -1, FLOATS),
    "pow_float_scalar": (lambda a, b, c: a.abs() ** 1.7 + torch.pow(a, 3.0), FLOATS),
    "pow_int": (lambda a, b, c: a ** 2 + a.pow(3) + a ** 0, INTS),
    "rpow": (lambda a, b, c: 2 ** a + 0.5 ** b, FLOATS),
    "floor_divide": (lambda a, b, c: a // nz(b), ALL),
    "floor_divide_scalar": (lambda a, b, c: torch.floor_divide(a, -3) + (a // 2.5 if a.is_floating_point() else a // 2), ALL),
    "div_trunc": (lambda a, b, c: torch.div(a, nz(b), rounding_mode="trunc"), ALL),
    "div_floor": (lambda a, b, c: a.div(nz(b), rounding_mode="floor"), ALL),
    "remainder": (lambda a, b, c: a % nz(b), ALL),
    "remainder_scalar": (lambda a, b, c: torch.remainder(a, -4) + a % 3, ALL),
    "fmod": (lambda a, b, c: torch.fmod(a, nz(b)) + a.fmod(3), ALL),
    "logical": (lambda a, b, c: torch.logical_and(a > 0, b) | torch.logical_or(a, c < 0)
                ^ torch.logical_xor(a, b) | torch.logical_not(c), ALL),
    "bitwise": (lambda a, b, c: (a & b) | (a ^ c) | torch.bitwise_not(b) | a.bitwise_not(), INTS + BOOL),
    "isnan_isinf": (lambda a, b, c: torch.isnan(a) | torch.isinf(b) ^ torch.isfinite(a), ALL),
    "nan_to_num": (lambda a, b, c: torch.nan_to_num(a) + a.nan_to_num(nan=1.0, posinf=2.0, neginf=-2.0), ALL),
    "clamp": (lambda a, b, c: torch.clamp(a, -1, 1) + a.clamp(min=0) + a.clamp_max(2) + torch.clip(a, b, c), ALL),
    "clamp_float_bound_on_int": (lambda a, b, c: torch.clamp(a, min=0.5), ALL),
    "lerp": (lambda a, b, c: torch.lerp(a, c, 0.3) + a.lerp(b, 0.8) + torch.lerp(a, b, c), FLOATS),
    "addcmul": (lambda a, b, c: torch.addcmul(a, b, c, value=0.5) + a.addcmul(b, c), ALL),
    "addcdiv": (lambda a, b, c: torch.addcdiv(a, b, c.abs() + 1, value=2), FLOATS),
    "masked_fill": (lambda a, b, c: a.masked_fill(b > 0, -1) + torch.masked_fill(c, a > 0, 3), ALL),
    "type_conversions": (lambda a, b, c: a.type(torch.float32) + b.type(torch.float64) + c.half().float(), ALL),
    "int_round_trip": (lambda a, b, c: a.to(torch.int32).to(a.dtype) + b.long().to(a.dtype), ALL),
    "gelu": (lambda a, b, c: F.gelu(a), FLOATS),
    "gelu_tanh": (lambda a, b, c: F.gelu(a, approximate="tanh"), FLOATS),
    "silu": (lambda a, b, c: F.silu(a), FLOATS),
    "relu6": (lambda a, b, c: F.relu6(a * 4), FLOATS),
    "hardtanh": (lambda a, b, c: F.hardtanh(a, -0.5, 0.75), FLOATS),
    "leaky_relu": (lambda a, b, c: F.leaky_relu(a) + F.leaky_relu(b, 0.2), FLOATS),
    "elu": (lambda a, b, c: F.elu(a) + F.elu(b, alpha=0.5), FLOATS),
    "hardswish": (lambda a, b, c: F.hardswish(a * 4), FLOATS),
    "hardsigmoid": (lambda a, b, c: F.hardsigmoid(a * 4), FLOATS),
    "mish": (lambda a, b, c: F.mish(a), FLOATS),
    "softplus": (lambda a, b, c: F.softplus(a) + F.softplus(a * 10, beta=2, threshold=5), FLOATS),
}

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 2.5, -2.5, 0.5, -1.5, 1.0]


def make_inputs(dtype, device):
    a = randn((6, 10), dtype, device, "transposed")
    if dtype.is_floating_point:
        a[0] = torch.tensor(SPECIAL, dtype=dtype, device=device)
    b = randn((10,), dtype, device)
    c = randn((6, 10), dtype, device)
    return a, b, c


# (entry, dtype, target id) -> why it fails today, in code outside these ops (none at present)
# Both GPU differences found on the H200 in session 11 are fixed: pow goes through libdevice on
# compiled Triton, and round(decimals) in half precision rounds the scaled value to the half type
# on CUDA as torch's CUDA kernel does (session 12, checked on the H200).
KNOWN_FAILURES: dict = {}

CASES = [(name, dtype) for name, (_, dtypes) in OPS.items() for dtype in dtypes]
IDS = [f"{n}-{str(d).split('.')[-1]}" for n, d in CASES]


def _check(actual, expected):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert_close(actual, expected)


@pytest.mark.parametrize("name,dtype", CASES, ids=IDS)
def test_decomposition_matches_eager(name, dtype):
    """Capture + decomposition into prims, run with the prims' eager implementations."""
    fn, _ = OPS[name]
    args = make_inputs(dtype, torch.device("cpu"))
    expected = fn(*args)
    actual = kiln.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    _check(actual, expected)


def _per_op_cases():
    cases = []
    for target in TARGETS:
        for name, dtype in CASES:
            # C++ builds cost a gcc run each: per entry only float32 (the other dtypes are batched)
            if target.id == "cpp" and dtype not in (torch.float32, torch.bool):
                continue
            known = KNOWN_FAILURES.get((name, dtype, target.id))
            marks = [pytest.mark.xfail(reason=known, strict=False)] if known else []
            cases.append(pytest.param(name, dtype, target.values[0], marks=marks,
                                      id=f"{name}-{str(dtype).split('.')[-1]}-{target.id}"))
    return cases


@pytest.mark.parametrize("name,dtype,target", _per_op_cases())
def test_compiled_matches_eager(name, dtype, target):
    fn, _ = OPS[name]
    with on_target(target) as device:
        args = make_inputs(dtype, device)
        expected = fn(*args)
        compiled = kiln.compile(fn, fullgraph=True)
        _check(compiled(*args), expected)
        args2 = make_inputs(dtype, device)
        _check(compiled(*args2), fn(*args2))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ALL + BOOL, ids=lambda d: str(d).split(".")[-1])
def test_all_entries_batched_in_one_graph(dtype, target):
    """Every entry of a dtype in one compiled graph (few builds, every dtype on every target)."""
    target_id = "cpp" if target[1] == "cpp" else "triton_interp" if target[0] == "cpu" else "triton_cuda"
    names = [n for n, (_, dtypes) in OPS.items()
             if dtype in dtypes and (n, dtype, target_id) not in KNOWN_FAILURES]
    fns = [OPS[n][0] for n in names]

    def batch(a, b, c):
        outs = []
        for f in fns:
            outs.append(f(a, b, c))
        return tuple(outs)

    with on_target(target) as device:
        args = make_inputs(dtype, device)
        actual = kiln.compile(batch, fullgraph=True)(*args)
        for name, f, out in zip(names, fns, actual):
            expected = f(*args)
            try:
                _check(out, expected)
            except AssertionError as e:
                raise AssertionError(f"entry {name}: {e}") from None


@pytest.mark.parametrize("target", TARGETS)
def test_activation_chain_is_one_kernel(target):
    def chain(x, y):
        h = F.gelu(x) * F.silu(y) + F.hardswish(x)
        h = torch.clamp(h, -2, 2) ** 2 + torch.lerp(x, y, 0.25)
        return torch.where(torch.isfinite(h), F.softplus(h), h * 0) + (x // 0.5)
    with on_target(target) as device:
        x = randn((8, 16), torch.float32, device, "transposed")
        y = randn((16,), torch.float32, device)
        assert kiln.explain(chain)(x, y).kernel_count == 1
        assert_close(kiln.compile(chain, fullgraph=True)(x, y), chain(x, y))


def test_round_ties_to_even_and_sign_of_special_values():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 1e30, float("nan"), float("-inf")])
    fn = lambda t: (torch.round(t), torch.sign(t), torch.trunc(t))  # noqa: E731
    for out, exp in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(out, exp)


def test_integer_pow_by_tensor_is_reported():
    fn = lambda a, b: a ** b  # noqa: E731
    a, b = torch.arange(4), torch.arange(4)
    with pytest.raises(Exception, match="integer tensor exponents"):
        kiln.compile(fn, fullgraph=True)(a, b)
