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


def test_simplify_index_reaches_a_fixed_point():
    """One pass over this load of a T5 training kernel (over [8, 16, 2, 2, 32]) left
    ``2048*floor(i4/32)`` behind, a division of the inner loop variable that kept gcc from
    vectorizing the row; simplify_index now passes again while a Mod or floor is left, and the
    index still means the same address at every point."""
    import itertools

    import sympy

    from kiln.inductor import ir
    syms = {f"i{k}": ir.index_symbol(k) for k in range(5)}
    raw = sympy.sympify(
        "Mod(i4, 32) + 8192*(Mod(floor((Mod(16*i0 + i1 + floor(i2/2 + i3/4 + i4/128), 64))/64"
        " + floor(floor((Mod(64*i2 + 32*i3 + i4, 128))/32)/4)/64) + floor(i0/4 + i1/64"
        " + floor(i2/2 + i3/4 + i4/128)/64), 2)) + 32*(Mod(16*i0 + i1 + floor(i2/2 + i3/4"
        " + i4/128) + floor(floor((Mod(64*i2 + 32*i3 + i4, 128))/32)/4), 64))"
        " + 2048*(Mod(floor((Mod(64*i2 + 32*i3 + i4, 128))/32), 4))", locals=syms)
    shape = (8, 16, 2, 2, 32)
    out = ir.simplify_index(raw, ir.ranges_of(shape))
    assert syms["i4"] not in set().union(*[f.free_symbols for f in out.atoms(sympy.Mod, sympy.floor)]), out
    names = [syms[f"i{k}"] for k in range(5)]
    f_raw, f_out = sympy.lambdify(names, raw, "math"), sympy.lambdify(names, out, "math")
    for point in itertools.product(*(range(0, n, max(1, n // 4)) for n in shape)):
        assert f_raw(*point) == f_out(*point), point
