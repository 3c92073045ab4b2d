"""torch.nn.init's fan helpers (``_calculate_fan_in_and_fan_out``, ``_calculate_correct_fan``,
``calculate_gain``) are pure Python over a tensor's dim() and sizes: inlined as torch's Python
(values_callables.INLINED_TORCH_FUNCTIONS), so a forward that scales by them is one graph
(PyTorch's test_functions test_get_calculate_correct_fan broke at the call)."""
import math

import pytest
import torch

import kiln


def scaled(x, w):
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(w)
    fan = torch.nn.init._calculate_correct_fan(w, "fan_out")
    gain = torch.nn.init.calculate_gain("leaky_relu", 0.2)
    return x * gain / math.sqrt(fan_in) + fan_out - fan, fan_in, fan


@pytest.mark.parametrize("shape", [(4, 3), (8, 3, 3, 3), (5, 2, 7)])
def test_fans_match_eager_in_one_graph(shape):
    x, w = torch.randn(3), torch.randn(*shape)
    kiln.reset()
    out = kiln.explain(scaled, backend="eager")(x, w)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    got, want = out.result, scaled(x, w)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:]


def test_peer_case_and_a_new_shape_recompiles():
    def fn(x):  # PyTorch's test_get_calculate_correct_fan
        return x + torch.nn.init._calculate_correct_fan(x, "fan_in")
    compiled = kiln.compile(fn)
    for shape in ((10, 10), (10, 10), (6, 4, 2)):
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x), fn(x))


def test_bad_mode_raises_as_eager():
    def fn(x):
        return x + torch.nn.init._calculate_correct_fan(x, "fan_sideways")
    with pytest.raises(ValueError, match="fan_sideways"):
        kiln.compile(fn)(torch.randn(3, 3))
