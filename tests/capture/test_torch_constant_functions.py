"""torch functions of Python values only, computed at trace time as Dynamo folds them (no
break): dtype arithmetic, the default dtype (guarded: a change recompiles), and facts fixed
for the process or outside compiled calls. PyTorch's test_functions.py has a case for each."""
import pytest
import torch

import kiln


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    torch.testing.assert_close(out.result, fn(*args))


def promote(x):
    if x.dtype == torch.promote_types(torch.int32, torch.float32) and torch.can_cast(torch.int8, x.dtype):
        return x + 1
    return x - 1


def process_facts(x):
    if torch.distributed.is_available() and not torch.onnx.is_in_onnx_export():
        x = x * 2
    if torch._C._get_privateuse1_backend_name() == "privateuseone":
        x = x + 3
    return x


@pytest.mark.filterwarnings("ignore:is_fx_tracing")
def test_no_break():
    x = torch.randn(3)
    one_graph(promote, x)
    one_graph(process_facts, x)


def default_dtype(x):
    return x + 1 if x.dtype == torch.get_default_dtype() else x - 1


def test_default_dtype_is_guarded():
    x = torch.ones(2, dtype=torch.float64)
    one_graph(default_dtype, x)
    compiled = kiln.compile(default_dtype, backend="eager")
    assert torch.equal(compiled(x), x - 1)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.equal(compiled(x), x + 1)
    finally:
        torch.set_default_dtype(prev)
    assert kiln.stats()["recompiles"] == 1
