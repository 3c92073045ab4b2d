"""Creation ops: values are covered by the op table (tests/ops/optable/creation.py); here, a
creation with requires_grad inside compiled code is a graph break."""
import torch

import kiln


def test_creation_with_requires_grad_is_a_graph_break():
    def f(x):
        w = torch.zeros(3, requires_grad=True)
        return x + w
    e = kiln.explain(f)(torch.randn(3))
    assert e.graph_break_count == 1 and "requires_grad" in e.break_reasons[0].reason
