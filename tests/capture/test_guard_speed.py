"""The guard function reads torch's types, dtypes and flags from names bound when it is
compiled (capture/guards.bind_torch_names); what it accepts and rejects stays the same."""
import torch

import kiln
from kiln.capture.guards import bind_torch_names


def test_only_code_tokens_are_rewritten():
    src = ("def guard(L, G):\n"
           "    v0 = L['x']\n"
           "    if not (type(v0) is torch.Tensor and v0.dtype == torch.bfloat16 and L['s'] == 'torch.Tensor'\n"
           "            and torch.is_autocast_enabled('cpu') is False and torch.nn.functional is not None):\n"
           "        return False\n"
           "    return type(L['p']) is torch.nn.Parameter\n")
    ns = {"torch": torch}
    out = bind_torch_names(src, ns)
    assert "'torch.Tensor'" in out and "torch.nn.functional" in out
    assert "_torch_Tensor" in out and "_torch_bfloat16" in out and "_torch_nn_Parameter" in out
    assert ns["_torch_bfloat16"] is torch.bfloat16 and ns["_torch_nn_Parameter"] is torch.nn.Parameter
    exec(compile(out, "<test>", "exec"), ns)
    guard = ns["guard"]
    x, p = torch.ones(2, dtype=torch.bfloat16), torch.nn.Parameter(torch.ones(2))
    assert guard({"x": x, "s": "torch.Tensor", "p": p}, {}) is True
    assert guard({"x": x.float(), "s": "torch.Tensor", "p": p}, {}) is False
    assert guard({"x": x, "s": "_torch_Tensor", "p": p}, {}) is False
    assert guard({"x": x, "s": "torch.Tensor", "p": torch.ones(2)}, {}) is False


def test_compiled_guards_still_tell_dtypes_layouts_and_parameters_apart():
    m = torch.nn.Linear(4, 3)
    f = kiln.compile(m)
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            m.to(dtype)
            for x in (torch.randn(5, 4, dtype=dtype), torch.randn(4, 5, dtype=dtype).t()):
                torch.testing.assert_close(f(x), m(x))
    assert kiln.stats()["frames_compiled"] >= 2  # float64 parameters recompiled
