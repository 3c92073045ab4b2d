"""A compiled op returns a tensor of its own where eager's does, even when its decomposition
hands back an operand unchanged (``ceil``/``floor``/``trunc``/``round`` of an integer, ``sign``
of a bool): the result must not be the input itself, which an in-place op after it, in the
function or in the caller, would change (peer test_torchinductor ``test_input_mutation5``)."""
from __future__ import annotations

import pytest
import torch

import kiln


def _same(got, expected):
    assert got.dtype == expected.dtype and got.stride() == expected.stride(), (got, expected)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


ROUNDING = ["ceil", "floor", "trunc", "round"]


@pytest.mark.parametrize("name", ROUNDING)
def test_result_of_an_identity_decomposition_survives_a_later_input_mutation(name):
    def fn(x):
        tmp = getattr(x, name)()
        x.add_(10)
        return tmp

    expected_x, got_x = torch.arange(6).view(2, 3), torch.arange(6).view(2, 3)
    expected = fn(expected_x)
    got = kiln.compile(fn, fullgraph=True)(got_x)
    _same(got, expected)
    _same(got_x, expected_x)


@pytest.mark.parametrize("fn, make", [
    (lambda x: x.ceil(), lambda: torch.arange(4)),
    (lambda x: torch.sign(x), lambda: torch.tensor([True, False])),
], ids=["ceil_int", "sign_bool"])
def test_result_is_not_the_input_itself(fn, make):
    x = make()
    got = kiln.compile(fn, fullgraph=True)(x)
    assert got is not x and got.data_ptr() != x.data_ptr()
    got.zero_()  # the caller's in-place op on the result leaves x alone, as in eager
    _same(x, make())


def test_views_still_alias_their_input():
    x = torch.arange(6.0)
    got = kiln.compile(lambda t: t.view(2, 3), fullgraph=True)(x)
    got.add_(1)
    _same(x, torch.arange(6.0) + 1)
