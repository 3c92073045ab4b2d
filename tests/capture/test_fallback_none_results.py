"""A fallback op whose result tuple holds None among its tensors (``aten.convolution_backward``
with a partial output mask; PyTorch's test_torchinductor test_conv_backward) is one fallback
node for the tensors only (target ``op[0,2]``), the Nones put back in capture: it used to be a
graph break ("returns NoneType, not tensors"). Results match eager; the target resolves from
its name alone, as in a process that loads the graph from the disk cache."""
import pytest
import torch

import kiln
from kiln.capture import trace
from kiln.ops import core
from kiln.ops.core_fallback import FALLBACK_TARGETS, resolve

aten = torch.ops.aten


def conv_backward(g, x, w, mask):
    return aten.convolution_backward(g * 2, x + 1, w, [w.shape[0]], [1, 1], [0, 0], [1, 1],
                                     False, [0, 0], 1, mask)


def _args(layout):
    g, x, w = torch.randn(2, 4, 6, 6), torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    if layout == "channels_last":
        g, x = (t.to(memory_format=torch.channels_last) for t in (g, x))
    return g, x, w


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
# [True, False, True] is left out: eager's CPU kernel returns grad_weight anyway, where the
# meta kernel (what capture sees) returns None
@pytest.mark.parametrize("mask", [[True, False, False], [False, True, True], [True, True, True]])
def test_partial_output_mask_matches_eager(mask, layout):
    compiled = kiln.compile(lambda g, x, w: conv_backward(g, x, w, mask), fullgraph=True)
    for _ in range(2):
        args = _args(layout)
        expected, actual = conv_backward(*args, mask), compiled(*args)
        assert type(actual) is tuple and len(actual) == 3
        for a, e in zip(actual, expected):
            assert (a is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


def test_one_node_for_the_tensors_and_resolvable_by_name():
    graph = trace(conv_backward, list(_args("contiguous")) + [[True, False, True]]).graph
    targets = [n.args[0] for n in graph.calls if n.target is core.fallback]
    assert targets == ["torch.ops.aten.convolution_backward.default[0,2]"]
    FALLBACK_TARGETS.pop(targets[0], None)  # as in a fresh process
    g, x, w = _args("contiguous")
    got = resolve(targets[0])(g, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                              [True, False, True])
    want = aten.convolution_backward(g, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                     [True, False, True])
    assert len(got) == 2
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[2])
