"""The guard function reads torch's types, dtypes and flags from names bound when it is
compiled (capture/guards.bind_torch_names); what it accepts and rejects stays the same."""
import re

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


def test_sequential_children_are_read_from_its_table_and_reordering_recompiles():
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6))
    f = kiln.compile(seq)
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), seq(x))
        src = f._compiled_forward.cache.entries[0].capture.guard_source
        # the guard indexes the children once read in order, not through Sequential.__getitem__
        assert re.search(r"(v\d+) = d1\['_modules'\]\n +v\d+ = tuple\(\1\.values\(\)\)", src), src
        children = dict(seq._modules)  # the same children, another order: another function
        seq._modules.clear()
        for key in ("1", "2", "0"):
            seq._modules[key] = children[key]
        torch.testing.assert_close(f(x), seq(x))
        seq[0] = torch.nn.Linear(6, 6)  # a replaced child
        torch.testing.assert_close(f(x), seq(x))
    assert kiln.stats()["frames_compiled"] == 3


def test_a_sequential_with_its_own_getitem_keeps_the_plain_spelling():
    from kiln.capture.fast_sources import _is_sequential_index

    class Rev(torch.nn.Sequential):
        def __getitem__(self, i):
            return list(self._modules.values())[::-1][i]
    assert not _is_sequential_index(Rev(torch.nn.ReLU(), torch.nn.Tanh()), 0)
    assert _is_sequential_index(torch.nn.Sequential(torch.nn.ReLU()), 0)
    assert not _is_sequential_index(torch.nn.Sequential(torch.nn.ReLU()), 1)


def test_names_inside_strings_attributes_and_longer_names_are_left_alone():
    cases = {
        "a = torch.float32.is_floating_point\n": "a = torch.float32.is_floating_point\n",
        "b = x.torch.Tensor\nc = mytorch.float32\n": "b = x.torch.Tensor\nc = mytorch.float32\n",
        "k = L['it\\'s torch.float16'] == torch.bfloat16\n": "k = L['it\\'s torch.float16'] == _torch_bfloat16\n",
        'w = "torch.int64" or torch.Tensorx or torch.float32x\n': 'w = "torch.int64" or torch.Tensorx or torch.float32x\n',
        "z = (torch.int64, torch.bool, torch.nn.Module)\n": "z = (_torch_int64, _torch_bool, torch.nn.Module)\n",
    }
    for src, want in cases.items():
        ns = {}
        assert bind_torch_names(src, ns) == want
        assert all(ns[n] is getattr(torch, n[len("_torch_"):]) for n in ns)
