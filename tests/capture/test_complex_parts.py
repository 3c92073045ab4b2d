"""``Tensor.real`` / ``Tensor.imag`` (peer ``test_fft_real_input_real_output``): before, a break
("not supported by the capture table"). A real tensor's ``.real`` is the tensor itself and its
``.imag`` raises eager's error; a complex tensor's parts are fallback nodes."""
from __future__ import annotations

import pytest
import torch

import kiln


@pytest.mark.parametrize("fn", [
    lambda x: torch.fft.fftn(x).real,
    lambda x: torch.fft.fft(x).imag * 2 + torch.fft.fft(x).real,
    lambda x: (x.real * 2, x.real is x),
], ids=["fftn_real", "fft_parts", "real_of_real"])
def test_complex_parts_compile_and_match(fn):
    x = torch.randn(4, 6)
    got, want = kiln.compile(fn, fullgraph=True)(x), fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        if isinstance(w, bool):
            assert g is w
        else:
            assert g.dtype == w.dtype and g.stride() == w.stride() and torch.allclose(g, w, atol=1e-5)
    assert kiln.stats()["eager_runs"] == 0 and kiln.stats()["fallbacks"] == 0


def test_imag_of_a_real_tensor_raises_as_eager():
    with pytest.raises(RuntimeError, match="non-complex"):
        kiln.compile(lambda x: x.imag + 1)(torch.randn(3))
