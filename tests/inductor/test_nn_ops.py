"""Neural-network ops end to end against eager: normalizations, losses, embedding, gather,
matmul family, attention and convolution (library calls), over dtypes and both targets."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _targets(n, c, device):
    t = torch.randint(0, c, (n,), device=device)
    t[1] = -100  # ignored
    return t


CASES = {
    # name: (fn, input maker(dtype, device), dtypes)
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (12,), w, b),
                   lambda dt, dev: (randn((5, 12), dt, dev), randn((12,), dt, dev), randn((12,), dt, dev)), FLOATS),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (3, 4)), lambda dt, dev: (randn((2, 3, 4), dt, dev),), FLOATS),
    "rms_norm": (lambda x, w: F.rms_norm(x, (12,), w, 1e-6), lambda dt, dev: (randn((5, 12), dt, dev), randn((12,), dt, dev)), FLOATS),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b),
                   lambda dt, dev: (randn((2, 4, 3, 3), dt, dev), randn((4,), dt, dev), randn((4,), dt, dev)), (torch.float32,)),
    "batch_norm_eval": (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
                        lambda dt, dev: (randn((2, 4, 3, 3), dt, dev), randn((4,), dt, dev),
                                         torch.rand(4, device=dev).to(dt) + 0.5, randn((4,), dt, dev), randn((4,), dt, dev)),
                        (torch.float32,)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda dt, dev: (randn((6, 10), dt, dev), _targets(6, 10, dev)), FLOATS),
    "cross_entropy_smooth": (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, reduction="sum"),
                             lambda dt, dev: (randn((6, 10), dt, dev), _targets(6, 10, dev)), (torch.float32,)),
    "cross_entropy_3d_none": (lambda x, t: F.cross_entropy(x, t, reduction="none"),
                              lambda dt, dev: (randn((2, 5, 3), dt, dev), torch.randint(0, 5, (2, 3), device=dev)), (torch.float32,)),
    "cross_entropy_probs": (lambda x, p: F.cross_entropy(x, p), lambda dt, dev: (randn((4, 6), dt, dev), torch.rand(4, 6, device=dev).softmax(-1).to(dt)), (torch.float32,)),
    "nll_weighted": (lambda x, t, w: F.nll_loss(x.log_softmax(-1), t, weight=w),
                     lambda dt, dev: (randn((6, 10), dt, dev), _targets(6, 10, dev), torch.rand(10, device=dev).to(dt)), (torch.float32,)),
    "mse": (lambda a, b: F.mse_loss(a, b), lambda dt, dev: (randn((4, 5), dt, dev), randn((4, 5), dt, dev)), FLOATS),
    "l1_none": (lambda a, b: F.l1_loss(a, b, reduction="none"), lambda dt, dev: (randn((4, 5), dt, dev), randn((5,), dt, dev)), (torch.float32,)),
    "bce_logits": (lambda a, b: F.binary_cross_entropy_with_logits(a, b),
                   lambda dt, dev: (randn((4, 5), dt, dev) * 10, torch.rand(4, 5, device=dev).to(dt)), (torch.float32,)),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda dt, dev: (randn((7, 4), dt, dev), torch.randint(0, 7, (2, 3), device=dev)), FLOATS),
    "gather": (lambda x, i: torch.gather(x, 1, i) + 1, lambda dt, dev: (randn((4, 6), dt, dev), torch.randint(0, 6, (4, 3), device=dev)), (torch.float32,)),
    "index_select": (lambda x, i: x.index_select(0, i), lambda dt, dev: (randn((5, 3), dt, dev), torch.randint(0, 5, (7,), device=dev)), (torch.float32,)),
    "matmul_batched": (lambda a, b: a @ b, lambda dt, dev: (randn((2, 3, 4, 5), dt, dev), randn((3, 5, 2), dt, dev)), FLOATS),
    "matmul_vec": (lambda a, b: torch.matmul(a, b), lambda dt, dev: (randn((3, 4, 5), dt, dev), randn((5,), dt, dev)), (torch.float32,)),
    "bmm_epilogue": (lambda a, b: torch.relu(torch.bmm(a, b)) * 0.5, lambda dt, dev: (randn((2, 3, 4), dt, dev), randn((2, 4, 5), dt, dev)), FLOATS),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), lambda dt, dev: (randn((5,), dt, dev), randn((3, 4), dt, dev), randn((4, 5), dt, dev)), (torch.float32,)),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    lambda dt, dev: tuple(randn((2, 2, 8, 4), dt, dev) for _ in range(3)), (torch.float32,)),
    "sdpa_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  lambda dt, dev: tuple(randn((1, 2, 5, 4), dt, dev) for _ in range(3)) + (torch.rand(5, 5, device=dev) > 0.3,), (torch.float32,)),
    "conv2d_relu": (lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1, stride=2)),
                    lambda dt, dev: (randn((1, 3, 8, 8), dt, dev), randn((4, 3, 3, 3), dt, dev), randn((4,), dt, dev)), (torch.float32,)),
    "conv1d": (lambda x, w: F.conv1d(x, w, groups=2), lambda dt, dev: (randn((2, 4, 9), dt, dev), randn((6, 2, 3), dt, dev)), (torch.float32,)),
}

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "embedding", "bmm_epilogue", "mse"])
def test_one_kernel_each(name, target):
    fn, make, _ = CASES[name]
    with on_target(target) as device, torch.no_grad():
        assert kiln.explain(fn)(*make(torch.float32, device)).kernel_count == 1


def test_out_of_range_index_raises_instead_of_reading_garbage():
    w = torch.randn(5, 3)
    f = kiln.compile(lambda w, i: F.embedding(i, w))
    with pytest.raises(IndexError, match="out of range"):
        f(w, torch.tensor([0, 7]))
    assert_close(f(w, torch.tensor([4, 0])), F.embedding(torch.tensor([4, 0]), w))


def test_negative_gather_index_raises_like_eager():
    x = torch.randn(3, 4)
    f = kiln.compile(lambda x, i: torch.gather(x, 1, i))
    with pytest.raises(IndexError):
        f(x, torch.tensor([[0], [-1], [2]]))
