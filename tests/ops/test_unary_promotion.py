"""Type promotion and dtype support of every unary op kiln captures, against eager.

The ops are read off the capture table (``kiln.capture.torch_api``): every torch callable and
Tensor method that eager accepts with one tensor argument. For each input dtype:

* where eager accepts the call, kiln (backends eager and kiln) returns eager's dtype and values
  and compiles it without a graph break (a few calls break by design, listed below);
* where eager raises, kiln raises the same exception type (capture refuses the call and eager
  raises its own error), never a crash inside a compiled graph or another result.

On the kiln backend the accepted calls of one dtype are compiled together in one graph, so the
whole table costs one compile per dtype.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.capture import torch_api

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float32: (1e-5, 1e-5),
       torch.float64: (1e-7, 1e-7)}
# results that are random or uninitialized: dtype and shape are compared, not values
UNDETERMINED = {"torch.rand_like", "torch.randn_like", "torch.empty_like", "F.dropout",
                "torch.dropout", "torch.bernoulli", "Tensor.bernoulli", "torch.randint_like",
                "Tensor.normal_", "Tensor.uniform_", "Tensor.random_", "Tensor.exponential_",
                "F.rrelu", "torch.rrelu", "Tensor.new_empty", "torch.empty"}
# calls that are graph breaks by design, whatever the dtype
BREAKS = {"torch.tensor", "F.softmax", "F.log_softmax", "F.softmin", "Tensor.requires_grad_",
          "Tensor.item", "Tensor.tolist", "Tensor.numpy", "Tensor.nonzero", "torch.nonzero",
          "Tensor.unique", "torch.unique", "torch.as_tensor", "Tensor.__bool__"}


def _sample(dtype):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(2, 3, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(2, 3, generator=g) * 2).to(dtype)
    low = 0 if dtype == torch.uint8 else -5
    return torch.randint(low, 6, (2, 3), generator=g).to(dtype)


def _callers():
    out = []
    for fn in torch_api.TORCH_FUNCTIONS:
        out.append((torch_api.callable_name(fn).replace("torch._VariableFunctionsClass.", "torch."),
                    lambda x, fn=fn: fn(x)))
    for name in torch_api.TENSOR_METHODS:
        out.append(("Tensor." + name, lambda x, name=name: getattr(x, name)()))
    return out


def _eager(call, x):
    """(result, None) or (None, exception); None when the call is not a unary tensor op."""
    try:
        out = call(x.clone())
    except TypeError:
        return None  # needs more arguments
    except Exception as e:  # noqa: BLE001
        return None, e
    if not isinstance(out, torch.Tensor):
        return None
    return out, None


def _table():
    """{dtype: [(name, call, eager result or None, eager exception or None)]}."""
    table = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in DTYPES:
            rows = table[dtype] = []
            x = _sample(dtype)
            for name, call in _callers():
                got = _eager(call, x)
                if got is not None:
                    rows.append((name, call, *got))
    return table


TABLE = _table()


def _check_value(name, out, ref):
    assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype}, eager {ref.dtype}"
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)}, eager {tuple(ref.shape)}"
    if name in UNDETERMINED:
        return
    rtol, atol = TOL.get(ref.dtype, (0, 0))
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True, msg=name)


def test_the_table_covers_the_unary_ops():
    names = {name for rows in TABLE.values() for name, *_ in rows}
    for must in ("torch.square", "Tensor.abs", "torch.exp", "Tensor.floor", "torch.sigmoid",
                 "torch.gelu", "F.silu", "Tensor.any", "torch.sign", "Tensor.bitwise_not", "torch.neg"):
        assert must in names, must
    assert len(names) > 60


@pytest.mark.parametrize("backend", ["eager", "kiln"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unary_results_match_eager(dtype, backend):
    rows = [(n, c, r) for n, c, r, e in TABLE[dtype] if e is None and n not in BREAKS]
    x = _sample(dtype)

    def every_op(x):
        return tuple(call(x.clone()) for _, call, _ in rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager's own deprecation warnings
        outs = kiln.compile(every_op, backend=backend, fullgraph=True)(x)
    for (name, _, ref), out in zip(rows, outs):
        _check_value(name, out, ref)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unary_refusals_raise_eagers_error(dtype):
    rows = [(n, c, e) for n, c, r, e in TABLE[dtype] if e is not None]
    x = _sample(dtype)
    wrong = []
    for name, call, err in rows:
        kiln.reset()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kiln.compile(call)(x.clone())
        except Exception as e:  # noqa: BLE001
            if type(e) is not type(err):
                wrong.append(f"{name}: {type(e).__name__} ({str(e)[:80]}), eager {type(err).__name__}")
        else:
            wrong.append(f"{name}: returned, eager raises {type(err).__name__}: {err}")
    assert not wrong, "\n".join(wrong)
