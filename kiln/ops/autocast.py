"""Autocast policy as data: which ops run in the autocast dtype, which in float32, which in the
widest floating type of their inputs, per device type.

Inside ``torch.autocast`` torch casts the floating-point tensor inputs of some ops before running
them. Capture applies the same casts while it records (``kiln/capture/autocast.py``), as explicit
``core.to_dtype`` nodes, so captured graphs are autocast-free. The tables are keyed by op name:
a core op's name (``mm``, ``softmax``) or, for a fallback node, the short name of the torch
function it calls (``cumsum``, ``kl_div``). Ops not listed run in their input dtypes.

Ops with every rule in one file (ops/op_*.py) declare their policy there instead, as the
``autocast=`` property of their define; ``policy`` reads it first.

The lists follow torch's autocast registrations (the "Autocast Op Reference" of torch.amp), with
kiln's core op names added where they differ from torch's (``conv``, ``sdpa``,
``bce_with_logits``, ``cross_entropy``). The CPU lists were checked op by op against eager
torch 2.13 under ``torch.autocast("cpu", bfloat16 / float16)``.

Policies (what happens to an *eligible* input: a floating tensor, not float64, on the autocast
device):

- ``LOWER``:   cast to the autocast dtype (matmuls, convolutions, attention);
- ``FP32``:    cast to float32, unless the call passes an explicit ``dtype`` (softmax, sum);
- ``PROMOTE``: cast all to the widest of the autocast dtype and the eligible inputs' dtypes;
- ``BANNED``:  torch raises under autocast (``binary_cross_entropy`` on CUDA): a graph break,
  so eager torch raises its own error.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

from kiln.ops.registry import _OPS

LOWER = "lower"
FP32 = "fp32"
PROMOTE = "promote"
BANNED = "banned"

DEVICE_TYPES = ("cpu", "cuda")


def _cpu_dtypes() -> tuple:
    """The dtypes this torch's CPU autocast accepts (float16 only in recent releases)."""
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if getattr(torch.autocast("cpu", dtype=dtype), "_enabled", True):
                    out.append(dtype)
            except Exception:  # noqa: BLE001 - refused: not supported
                pass
    return tuple(out)


# Autocast dtypes torch accepts per device (others: torch warns and disables autocast, or
# raises; capture makes them a graph break so eager torch does what it does).
SUPPORTED_DTYPES = {
    "cpu": _cpu_dtypes(),
    "cuda": (torch.float16, torch.bfloat16),
}

_MATMUL_FAMILY = """
    bmm addmm addbmm baddbmm linear matmul prelu
    conv conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
    sdpa scaled_dot_product_attention
"""


def _table(**groups) -> dict:
    table = {}
    for policy, names in groups.items():
        for name in names.split():
            assert name not in table, f"autocast policy lists {name} twice"
            table[name] = {"lower": LOWER, "fp32": FP32, "promote": PROMOTE, "banned": BANNED}[policy]
    return table


CPU_POLICY = _table(
    lower=_MATMUL_FAMILY + " mkldnn_rnn_layer",
    fp32="""
        avg_pool3d binary_cross_entropy grid_sampler grid_sampler_2d grid_sampler_3d polar prod
        quantile nanquantile stft cdist trace view_as_complex
        cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse
        max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d adaptive_max_pool3d
        fractional_max_pool2d fractional_max_pool3d
        reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d replication_pad3d
        mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss
        smooth_l1_loss cross_entropy cross_entropy_loss l1_loss huber_loss margin_ranking_loss
        soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss kl_div
        multilabel_margin_loss bce_with_logits binary_cross_entropy_with_logits
        fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2
        fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft
        linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals
        linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv
        linalg_tensorsolve linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh
        linalg_lstsq linalg_inv_ex
        fake_quantize_per_tensor_affine geqrf qr svd triangular_solve
    """,
    promote="stack cat index_copy",
)

CUDA_POLICY = _table(
    lower=_MATMUL_FAMILY + """
        addmv addr einsum mv chain_matmul multi_dot linalg_multi_dot
        lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
    """,
    fp32="""
        acos asin cosh erfinv expm1 log10 log2 log1p reciprocal sinh tan
        pow __rtruediv__ softplus layer_norm group_norm frobenius_norm nuclear_norm
        cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d
        hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss
        margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss bce_with_logits binary_cross_entropy_with_logits cross_entropy
        dist pdist cdist renorm logsumexp
        prod softmax log_softmax softmin cumprod cumsum linalg_vector_norm linalg_matrix_norm
        norm normalize
    """,
    promote="addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put tensordot scatter_add",
    banned="binary_cross_entropy",
)

POLICIES = {"cpu": CPU_POLICY, "cuda": CUDA_POLICY}


def policy(device_type: str, name: str) -> str | None:
    """The cast policy of op ``name`` under autocast on ``device_type`` (None: inputs as they are):
    the ``autocast=`` property of the core op of that name where it declares one (ops/op_*.py),
    else the tables above (older core ops, and fallback nodes by their torch function's name)."""
    op = _OPS.get(("core", name))
    if op is not None and op.autocast is not None:
        return op.autocast.get(device_type)
    return POLICIES.get(device_type, {}).get(name)


def eligible(dtype: torch.dtype, device: torch.device, device_type: str) -> bool:
    """Whether autocast casts a tensor of this dtype on this device (floating, not float64)."""
    return device.type == device_type and dtype.is_floating_point and dtype != torch.float64


def promote_dtype(autocast_dtype: torch.dtype, dtypes) -> torch.dtype:
    """The widest of the autocast dtype and the eligible inputs' dtypes (float32 wins)."""
    out = autocast_dtype
    for d in dtypes:
        if d == torch.float32 or out == torch.float32:
            out = torch.float32
        elif d != out:
            raise ValueError(f"autocast cannot promote {out} with {d}")
    return out


# ------------------------------------------------------------------ torch's autocast state
# torch >= 2.4 takes a device type; older releases had one function per device.
_NEW_API = hasattr(torch, "get_autocast_dtype")


def is_enabled(device_type: str) -> bool:
    if _NEW_API:
        return torch.is_autocast_enabled(device_type)
    return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def get_dtype(device_type: str) -> torch.dtype:
    if _NEW_API:
        return torch.get_autocast_dtype(device_type)
    return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def enabled_expr(device_type: str) -> str:
    """A Python expression (over ``torch``) that reads the autocast switch: for guards."""
    if _NEW_API:
        return f"torch.is_autocast_enabled({device_type!r})"
    return "torch.is_autocast_cpu_enabled()" if device_type == "cpu" else "torch.is_autocast_enabled()"


def dtype_expr(device_type: str) -> str:
    if _NEW_API:
        return f"torch.get_autocast_dtype({device_type!r})"
    return "torch.get_autocast_cpu_dtype()" if device_type == "cpu" else "torch.get_autocast_gpu_dtype()"


@contextlib.contextmanager
def disabled(device_types=DEVICE_TYPES):
    """Run with torch's autocast off on these device types (compiled graphs hold their casts
    explicitly, so library calls inside them must not cast again)."""
    on = [d for d in device_types if is_enabled(d)]
    if not on:
        yield
        return
    with contextlib.ExitStack() as stack:
        for d in on:
            stack.enter_context(torch.autocast(d, enabled=False))
        yield


def run_disabled(fn, device_types=DEVICE_TYPES):
    """``fn`` wrapped to run with autocast off on ``device_types``."""
    def run(*args):
        with disabled(device_types):
            return fn(*args)
    run.__wrapped__ = fn
    return run


__all__ = ["LOWER", "FP32", "PROMOTE", "BANNED", "POLICIES", "policy", "eligible",
           "promote_dtype", "is_enabled", "get_dtype", "disabled", "run_disabled"]
