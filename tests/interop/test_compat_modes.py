"""kiln.compile's modes as torch.compile's (issue 27): the max-autotune modes tune kernels,
"max-autotune" also records CUDA graphs as "reduce-overhead" does, and so guards modules by
identity (a CUDA graph reads one instance's parameters in place)."""
import pytest
import torch

import kiln
from kiln import api_args


@pytest.mark.parametrize("mode, cudagraphs, autotune", [
    (None, False, False), ("default", False, False), ("reduce-overhead", True, False),
    ("max-autotune", True, True), ("max-autotune-no-cudagraphs", False, True)])
def test_modes_match_torch_compiles_meaning(mode, cudagraphs, autotune):
    assert (mode in api_args.CUDAGRAPH_MODES) is cudagraphs
    assert api_args.autotune(mode, {}) is autotune
    m = torch.nn.Linear(3, 2)
    cm = kiln.compile(m, mode=mode)
    x = torch.randn(4, 3)
    torch.testing.assert_close(cm(x), m(x))
    guards = "\n".join(cm._compiled_forward.cache.entries[0].guards)
    assert (f"id(L['self']) == {id(m)}" in guards) is cudagraphs, guards
    other = torch.nn.Linear(3, 2)  # another instance: its own entry only where guarded by id
    torch.testing.assert_close(kiln.compile(other, mode=mode)(x), other(x))
    assert kiln.stats()["frames_compiled"] == (2 if cudagraphs else 1)


def test_options_unknown_key_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        kiln.compile(lambda x: x, options={"triton.cudagraphs": True})
    for key in api_args.OPTIONS:
        assert key in str(info.value)
