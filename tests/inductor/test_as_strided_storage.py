"""``as_strided`` of a value computed inside the graph reads eager's storage (issue 24 item 2,
peer ``test_as_strided``, ``test_repeat_as_strided``).

``as_strided`` ignores its operand's strides and reads its storage, so the operand must be laid
out as eager's is. kiln's prims graph lays values out its own way (a repeat of size-1 dims is an
expand, strides 0; a product is contiguous): the decomposition records eager's strides of a
storage-reading fallback's operands from the core graph, and lowering copies an operand kept
otherwise into a buffer laid out so (``inductor/lower.py _in_eager_storage``). Graph inputs
and views of them are handed over as they are.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from testing import TARGETS, on_target

F = torch.nn.functional
CASES = {
    "permuted_product": (lambda x: torch.as_strided(x.permute(1, 0) * 2, (4, 3), (1, 4)) + 1,
                         lambda: (torch.randn(3, 4),)),
    "permuted_flat_read": (lambda x: torch.as_strided(x.t() + 1, (12,), (1,)),
                           lambda: (torch.randn(3, 4),)),
    "channels_last": (lambda x: torch.as_strided(x + 1, (120,), (1,)) * 2,
                      lambda: (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),)),
    "channels_last_rows": (lambda x: torch.as_strided(torch.relu(x) * x, (2, 60), (60, 1)),
                           lambda: (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),)),
    "repeat_of_size_one": (lambda x: torch.as_strided(x.repeat(3, 2), (3, 2), (2, 1)) * 2,
                           lambda: (torch.randn(1, 1),)),
    "repeat_of_size_one_row": (lambda x: torch.as_strided(x.repeat(3, 1), (4, 3), (1, 4)) + x.sum(),
                               lambda: (torch.randn(1, 4),)),
    "repeat": (lambda x: torch.as_strided(x.repeat(2, 1, 2), (8,), (3,)), lambda: (torch.randn(2, 3),)),
    "expanded_sum": (lambda x, y: torch.as_strided(x + y, (6,), (2,)),
                     lambda: (torch.randn(3, 1), torch.randn(1, 4))),
    "input_slice": (lambda x: torch.as_strided(x[1:], (2, 2), (1, 2)), lambda: (torch.randn(5, 4),)),
    "offset": (lambda x: torch.as_strided(x.t() * 3, (2, 2), (1, 3), 2), lambda: (torch.randn(3, 4),)),
    "method": (lambda x: (x.permute(0, 2, 3, 1) + 1).as_strided((2, 3), (1, 2)),
               lambda: (torch.randn(2, 3, 4, 5),)),
    "aten": (lambda x: torch.ops.aten.as_strided(x.expand(2, 3, 4).contiguous().transpose(0, 2) * 1,
                                                 (4, 6), (1, 4)),
             lambda: (torch.randn(3, 4),)),
    "padded_transpose": (lambda x: torch.as_strided(F.pad(x.t(), (1, 1)), (6,), (2,)),
                         lambda: (torch.randn(3, 4),)),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_as_strided_of_an_intermediate_reads_eager_storage(case, target):
    fn, make = CASES[case]
    with on_target(target) as device, kiln.config.patch(strict=True):
        args = [x.to(device) for x in make()]
        want = fn(*args)
        got = kiln.compile(fn, fullgraph=True)(*args)
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got.cpu(), want.cpu()), (got, want)
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_runs"] == 0
