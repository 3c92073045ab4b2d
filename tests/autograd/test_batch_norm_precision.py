"""Training-mode batch norm on the CPU in fp32 is at least as accurate as eager's against a
float64 reference, forward and backward. torch's CPU kernel accumulates the statistics in
double; kiln's C++ sums are cascaded (fp32 blocks added into double partials), and batch norm
over few elements per channel computes in float64 (core_nn.batch_norm_dtype). Before that, kiln's weight and bias gradients over many elements per channel were 2-2.4x further from
float64 than eager's, and transformers' MobileNet-v1/v2 training steps did not match eager."""
import pytest
import torch
import torch.nn.functional as F

import kiln

# kiln's error may exceed eager's by this factor (it is about 0.2-0.6x of it since the change)
FACTOR = 1.5


def _bn_step(x, w, b, go, eps, fn):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b, eps)
    y.backward(go)
    return [t.detach().double() for t in (y, x.grad, w.grad, b.grad)]


def _batch_norm(x, w, b, eps):
    return F.batch_norm(x, None, None, w, b, True, 0.1, eps)


@pytest.mark.parametrize("shape, shift, eps", [
    ((32, 16, 32, 32), 3.0, 1e-5),   # many elements per channel: the sums' accuracy
    ((2, 64, 1, 1), 0.0, 1e-3),      # two per channel: the input gradient nearly cancels
])
def test_error_against_float64_within_eager_s(shape, shift, eps):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 4 + shift
    w = torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(shape[1], generator=g, dtype=torch.float64)
    go = torch.randn(shape, generator=g, dtype=torch.float64)
    ref = _bn_step(x, w, b, go, eps, _batch_norm)
    fp32 = [t.float() for t in (x, w, b, go)]
    eager = _bn_step(*fp32, eps, _batch_norm)
    compiled = _bn_step(*fp32, eps, kiln.compile(_batch_norm))
    for name, r, e, k in zip(("out", "grad input", "grad weight", "grad bias"), ref, eager, compiled):
        err_eager, err_kiln = (e - r).abs().max().item(), (k - r).abs().max().item()
        assert err_kiln <= FACTOR * err_eager + 1e-9 * r.abs().max().item(), \
            f"{name}: kiln {err_kiln:.3e} vs eager {err_eager:.3e} from float64"


def test_float64_only_for_cpu_fp32_training():
    from kiln.ops.core_nn import batch_norm_dtype
    from kiln.meta.tensor_meta import TensorMeta
    cpu32 = TensorMeta.of(torch.empty(2, 3, 4, 4))
    assert batch_norm_dtype(cpu32, True) == torch.float64
    assert batch_norm_dtype(cpu32, False) == torch.float32   # eval: eager stays in fp32 too
    # many elements per channel: fp32 (the cascaded sums keep it as accurate as eager)
    assert batch_norm_dtype(TensorMeta.of(torch.empty(8, 3, 16, 16)), True) == torch.float32
    assert batch_norm_dtype(TensorMeta.of(torch.empty(2, 3, dtype=torch.bfloat16)), True) == torch.float32
