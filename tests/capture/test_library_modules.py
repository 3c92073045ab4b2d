"""Functions of libraries whose module names start with "torch" (torchvision, torchaudio) are
user code: capture inlines them, private ones included, as Dynamo does. torchvision's Swin-T
broke 41 times at ``_get_relative_position_bias`` and ``_patch_merging_pad`` when kiln took
them for torch functions. ``torch._assert`` (timm's size checks) is an assert at trace time."""
import types

import pytest
import torch

import kiln
from testing import assert_close


def _in_module(fn, module):
    """fn as if defined in ``module`` (its globals stay this file's)."""
    out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__module__ = module
    out.__qualname__ = fn.__qualname__
    return out


def _bias(table, index, n):
    return table[index].view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)


@pytest.mark.parametrize("module", ["torchvision.models.swin_transformer", "torchaudio.functional",
                                    "torchmetrics"])
def test_a_private_function_of_a_torch_named_library_is_inlined(module):
    get_bias = _in_module(_bias, module)
    get_bias.__name__ = "_get_relative_position_bias"

    def f(x, table, index):
        return torch.softmax(x + get_bias(table, index, 4), -1)

    x, table = torch.randn(2, 3, 4, 4), torch.randn(49, 3)
    index = torch.randint(0, 49, (16,))
    out = kiln.explain(f)(x, table, index)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    kiln.reset()
    assert_close(kiln.compile(f, fullgraph=True)(x, table, index), f(x, table, index))


def test_torch_assert_on_sizes_is_checked_at_trace_time():
    def f(x):
        torch._assert(x.shape[-1] == 8, "width must be 8")
        return x * 2

    x = torch.randn(3, 8)
    assert_close(kiln.compile(f, fullgraph=True)(x), x * 2)
    with pytest.raises(AssertionError, match="width must be 8"):
        kiln.compile(f)(torch.randn(3, 5))


def test_torchvisions_usage_log_is_traced_through():
    # torchvision.utils._log_api_usage_once(fn): reads fn.__class__.__name__ and calls torch's
    # telemetry; both must trace (ConvNeXt and EfficientNet broke at every stochastic depth)
    def log_usage(obj):
        module = obj.__module__
        if not module.startswith("torchvision"):
            return
        name = obj.__class__.__name__
        if isinstance(obj, types.FunctionType):
            name = obj.__name__
        torch._C._log_api_usage_once(f"{module}.{name}")

    log_usage = _in_module(log_usage, "torchvision.utils")

    def depth(x, p, training):
        log_usage(depth)
        return x if not training or p == 0.0 else x * 2
    depth = _in_module(depth, "torchvision.ops.stochastic_depth")

    def f(x):
        return depth(x * 2, 0.1, False) + 1

    x = torch.randn(4)
    out = kiln.explain(f)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    kiln.reset()
    assert_close(kiln.compile(f, fullgraph=True)(x), f(x))
