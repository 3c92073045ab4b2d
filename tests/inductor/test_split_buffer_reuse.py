"""Buffer reuse in the wrapper: a buffer dead after an earlier step is reused, by plan, for a
new buffer of the same element count, dtype and device (printed as `# reuse bufA for bufB`)."""
import re

import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target, randn


def chain(x, y):
    a = torch.relu(torch.mm(x, y)) * 2
    b = torch.sigmoid(torch.mm(a, y)) + 1
    c = torch.tanh(torch.mm(b, y)) + 3
    return c


@pytest.mark.parametrize("target", TARGETS)
def test_dead_buffers_are_reused(target):
    with on_target(target) as device:
        x, y = randn((8, 8), torch.float32, device), randn((8, 8), torch.float32, device)
        out = kiln.explain(chain)(x, y)
        src = str(out.wrappers[0])
        reuses = re.findall(r"# reuse (buf\d+) for (buf\d+)", src)
        if target[1] == "cpp":
            assert len(reuses) == 2, src
            assert src.count("empty_strided") == 1
        else:  # Triton kernels write each pointwise result over the product it reads
            assert len(re.findall(r"# buf\d+ is written in place over buf\d+", src)) == 3, src
            assert src.count("empty_strided") == 0
        assert_close(out.result, chain(x, y))
        with kiln.config.patch(reuse_buffers=False):
            plain = str(kiln.explain(chain)(x, y).wrappers[0])
        assert "# reuse" not in plain and plain.count("empty_strided") == 3


def test_reuse_needs_same_dtype_and_size():
    def f(x, y):
        a = torch.relu(torch.mm(x, y))          # float32 [8, 8]
        b = torch.mm(a, y).to(torch.float64)    # float64: cannot take a's memory
        return torch.mm(b.float()[:4], y[:, :4]) * 2   # 16 elements: cannot either
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    out = kiln.explain(f)(x, y)
    assert "# reuse" not in str(out.wrappers[0])
    assert_close(out.result, f(x, y))


def test_output_and_input_buffers_are_never_reused():
    def f(x, y):
        a = torch.relu(torch.mm(x, y))
        b = torch.mm(a, y) + 1
        return a, b
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    out = kiln.explain(f)(x, y)
    assert "# reuse" not in str(out.wrappers[0])
    for r, e in zip(out.result, f(x, y)):
        assert_close(r, e)
