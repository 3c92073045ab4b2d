"""``x.data`` read in the trace: x's memory outside autograd, as ``x.detach()`` (Dynamo captures
it the same way). I-BERT's activation quantizers read ``x_act.data.min()`` in training: every
read was a break ("Tensor.data is not supported"), 192 graphs for two layers."""
import torch

import kiln


def test_data_read_is_detached_and_one_graph():
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        h = x @ w
        lo, hi = h.data.min(), h.data.max()  # statistics outside autograd
        return (h - lo) / (hi - lo), w.data * 2
    x = torch.randn(3, 4)
    kiln.reset()
    out = kiln.explain(f)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    want = f(x)
    for a, b in zip(out.result, want):
        torch.testing.assert_close(a, b)
        assert a.requires_grad == b.requires_grad
    got_grad = torch.autograd.grad(out.result[0].sum(), w)[0]
    torch.testing.assert_close(got_grad, torch.autograd.grad(want[0].sum(), w)[0])
