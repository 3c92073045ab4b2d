"""Helpers shared by the tests: code-generation targets, inputs, dtype-fitting tolerances."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

import kiln

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _triton_ok():
    try:
        import triton  # noqa: F401
        return True
    except Exception:  # noqa: BLE001
        return False


# (device, backend for that device)
TARGETS = [pytest.param(("cpu", "cpp"), id="cpp")]
if INTERPRET and _triton_ok():
    TARGETS.append(pytest.param(("cpu", "triton"), id="triton_interp"))
if CUDA:
    TARGETS.append(pytest.param(("cuda", "triton"), id="triton_cuda"))


@contextlib.contextmanager
def on_target(target):
    device, backend = target
    with kiln.config.patch(cpu_backend=backend if device == "cpu" else kiln.config.cpu_backend):
        yield torch.device(device)


TOLERANCES = {  # (rtol, atol) per dtype: fused kernels round once, eager rounds per op
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(actual, expected, dtype=None):
    dtype = dtype or getattr(expected, "dtype", None)
    rtol, atol = TOLERANCES.get(dtype, (0, 0))
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def randn(shape, dtype, device, layout="contiguous"):
    """Random tensor of `shape`; layout 'transposed' gives a non-contiguous view."""
    if layout == "transposed" and len(shape) >= 2:
        base = _rand(tuple(shape[:-2]) + (shape[-1], shape[-2]), dtype, device)
        return base.transpose(-1, -2)
    return _rand(shape, dtype, device)


def _rand(shape, dtype, device):
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(-20, 20, shape, device=device).to(dtype)


def compiled_kernel_count(fn, *args):
    return kiln.explain(fn)(*args).kernel_count


def config_env(env=None, **settings) -> dict:
    """A copy of ``env`` (default: os.environ) whose ``KILN_CONFIG`` also sets ``settings``, for a
    child process. The child applies the entries in order, so these win over inherited ones
    (conftest's ``graph_cache=0``) while the inherited rest still holds."""
    out = dict(os.environ if env is None else env)
    items = [out["KILN_CONFIG"]] if out.get("KILN_CONFIG") else []
    items += [f"{k}={'1' if v is True else '0' if v is False else v}" for k, v in settings.items()]
    out["KILN_CONFIG"] = ",".join(items)
    return out
