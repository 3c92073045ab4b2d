"""A C++ pointwise kernel whose trailing dims collapse into one loop reads through indices
that only the kernel's ranges simplify: ``t().unsqueeze(0).squeeze(0).t()`` of a computed
value loads at ``3*Mod(i0, 2) + Mod(i1 + floor(i0/2), 3)``, which is ``3*i0 + i1`` over
[2, 3]. The collapse was proven on the simplified index but applied to the raw one, so the
kernel read ``in[i0 % 3]`` (found through test_torchinductor's test_unsqueeze_inplace). Each
chain of views matches eager, on each target, contiguous or not."""
import pytest
import torch

import kiln
from testing import TARGETS, on_target, randn

CHAINS = {
    "t_unsqueeze_squeeze_t": lambda a: (a * 2).t().unsqueeze(0).squeeze(0).t() * 1,
    "t_reshape_reshape_t": lambda a: (a * 2).t().reshape(1, 3, 2).reshape(3, 2).t() + 1,
    "transpose_unsqueeze_squeeze": lambda a: (a.exp().transpose(0, 1).unsqueeze(1)
                                              .squeeze(1).transpose(0, 1)) - a,
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_view_chain_of_a_computed_value(name, layout, target):
    fn = CHAINS[name]
    with on_target(target) as device:
        for shape in ((2, 3), (4, 3)):
            if name == "t_reshape_reshape_t" and shape != (2, 3):
                continue
            a = randn(shape, torch.float32, device, layout)
            torch.testing.assert_close(kiln.compile(fn, fullgraph=True)(a), fn(a))
