"""``F.embedding(padding_idx=...)``: eager's backward leaves the padding row's gradient zero.
Capture dropped ``padding_idx``, so the row took the gradient of every position holding that id
(transformers' FNet, whose pad id 3 occurs in its inputs: its word-embedding gradient differed
from eager's in that one row). Forward values are unchanged."""
import pytest
import torch
import torch.nn.functional as F

import kiln


@pytest.mark.parametrize("padding_idx", [3, -2, None])
@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_padding_row_gets_no_gradient(padding_idx, backend):
    weight = torch.randn(10, 4, requires_grad=True)
    ids = torch.tensor([[3, 1, 8, 3], [0, 3, 8, 2]])

    def f(ids, weight):
        out = F.embedding(ids, weight, padding_idx=padding_idx)
        return (out * torch.linspace(0.5, 1.5, out.numel()).view(out.shape)).sum()
    want = torch.autograd.grad(f(ids, weight), weight)[0]
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(f, backend=backend)(ids, weight), weight)[0]
    torch.testing.assert_close(got, want)
    if padding_idx is not None:
        assert not got[padding_idx].any()


def test_module_with_padding_idx_in_training():
    emb = torch.nn.Embedding(10, 4, padding_idx=3)
    ids = torch.tensor([[3, 1, 3]])
    kiln.reset()
    kiln.compile(emb, backend="eager")(ids).sum().backward()
    assert not emb.weight.grad[3].any() and emb.weight.grad[1].any()
    assert kiln.stats()["graph_breaks"] == 0
