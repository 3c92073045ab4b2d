"""``.item()`` of an unwritten integer input under fullgraph=True is its guarded value
(capture/item_values.py): PyTorch's test_cat_unbacked_* and test_unbacked_floordiv_simplify."""
import pytest
import torch

import kiln
from testing import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_size_read_from_an_input_compiles_and_recompiles_per_value(dtype):
    def fn(x, y):
        z = y.item()
        return torch.cat([x, x.new_ones(z, x.shape[1])]) * 2
    compiled = kiln.compile(fn, fullgraph=True)
    for v in (0, 3, 3, 1, 0):
        x, y = torch.randn(2, 3, dtype=dtype), torch.tensor([v])
        got, want = compiled(x, y), fn(x, y)
        assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
        assert_close(got, want)
    assert kiln.stats()["frames_compiled"] == 3  # one entry per value seen: 0, 3, 1


def test_checks_on_the_value_and_bool_inputs():
    def fn(x, y, flag):
        z = y.item()
        torch._check(z // 2 == 3)
        return x + x.new_ones(z) if flag.item() else x
    x = torch.randn(6)
    assert_close(kiln.compile(fn, fullgraph=True)(x, torch.tensor(6), torch.tensor(True)),
                 fn(x, torch.tensor(6), torch.tensor(True)))


def test_computed_and_written_items_used_as_sizes_still_break():
    # their value is only known when the graph runs (a number in the graph:
    # capture/scalar_values.py), and a size needs it while tracing
    fns = [lambda x, y: x.new_ones((y + 1).item()),             # computed
           lambda x, y: x.new_ones(y.add_(1).item()),           # written first
           ]
    for fn in fns:
        x, y = torch.randn(2), torch.tensor(2)
        with pytest.raises(kiln.GraphBreakError, match="data-dependent argument of Tensor.new_ones.*Tensor.item"):
            kiln.compile(fn, fullgraph=True)(x, y.clone())
        assert_close(kiln.compile(fn)(x, y.clone()), fn(x, y.clone()))  # a break: eager's answer


def test_computed_float_item_computed_with_is_captured():
    fn = lambda x, y: x * y.float().item()  # noqa: E731
    x, y = torch.randn(2), torch.tensor(2)
    assert_close(kiln.compile(fn, fullgraph=True)(x, y.clone()), fn(x, y.clone()))
    e = kiln.explain(lambda x, y: x.new_ones(y.item()))(torch.randn(2), torch.tensor(2))
    assert e.graph_break_count >= 1 and "Tensor.item" in e.break_reasons[0].reason  # no fullgraph: a break
