"""A view or detach of an input that the compiled graph folds away (decomposition makes the
output the input node itself) must still come back as a new tensor object, as in eager:
``x.detach()`` returned ``x`` itself, requiring grad, and ``requires_grad_()`` on a returned
``x[0:]`` flipped the caller's input (pipeline._input_outputs, rebuild.fresh_aliases)."""
import pytest
import torch

import kiln

FOLDED = {
    "detach": lambda x: x.detach(),
    "slice": lambda x: x[0:],
    "view": lambda x: x.view(x.shape),
    "reshape": lambda x: x.reshape(x.shape),
    "in_a_tuple": lambda x: (x.detach(), x + 1),
    "transposed_back": lambda x: x.t().t(),          # a chain of views with the input's layout
    "unsqueezed_back": lambda x: x.unsqueeze(0).squeeze(0),
}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", list(FOLDED))
def test_a_folded_view_of_an_input_is_a_new_alias(name):
    fn = FOLDED[name]
    x = torch.randn(4, 3)
    want, got = _first(fn(x)), _first(kiln.compile(fn)(x))
    assert want is not x and got is not x
    assert got.data_ptr() == x.data_ptr() and got.shape == want.shape and got.stride() == want.stride()
    got.requires_grad_()              # metadata of the result is its own, as in eager
    assert not x.requires_grad
    got.data.add_(1)                  # the storage is shared, as in eager
    torch.testing.assert_close(x, got.detach())


def test_detach_of_an_input_that_requires_grad_does_not():
    x = torch.randn(4, 3, requires_grad=True)
    fn = FOLDED["detach"]
    got = kiln.compile(fn)(x)
    assert got is not x and not got.requires_grad and got.grad_fn is None
    fn2 = FOLDED["in_a_tuple"]
    d, y = kiln.compile(fn2)(x)
    assert not d.requires_grad and y.requires_grad
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


def test_under_no_grad_a_slice_of_a_grad_input_is_a_plain_alias():
    x = torch.randn(5, requires_grad=True)
    with torch.no_grad():
        got = kiln.compile(FOLDED["slice"])(x)
    assert got is not x and not got.requires_grad


def test_returning_the_input_itself_still_returns_it():
    x = torch.randn(3)
    assert kiln.compile(lambda x: x)(x) is x
    assert kiln.compile(lambda x: x.contiguous())(x) is x  # eager returns self here too
