"""The per-call L builder (api._fast_locals_builder) gives exactly what the general binding
(capture.tracer.frame_locals, inspect.signature) gives, for every call shape it accepts, and
declines the rest; compiled closures see their cells' current values."""
import pytest
import torch

import kiln
from kiln.api import _fast_locals_builder
from kiln.capture import frame_locals


def plain(a, b, c=3, d=4):
    return a


def posonly(a, /, b, c=5):
    return a


def make_closure():
    k = 2.0
    late = None

    def f(x, y=1):
        return x * k + (late or 0)
    late = 1.5
    return f


def make_empty_cell():
    def f(x):
        return x + later  # noqa: F821 - assigned after f is made, never here

    if False:
        later = 1
    return f


class M:
    def method(self, x, scale=2):
        return x * scale

    def forward(self, pixel_values=None, labels=None, *, return_dict=None, **kwargs):
        return pixel_values  # a transformers forward's shape


def varargs(a, *rest, k=1, **kw):
    return a


def posonly_kw(a, /, **kw):
    return a


CALLS = [
    (plain, (1, 2), {}), (plain, (1, 2, 9), {}), (plain, (1, 2, 9, 8), {}), (plain, (1,), {"b": 2}),
    (plain, (), {"a": 1, "b": 2, "d": 7}), (plain, (1, 2), {"d": 0}),
    (posonly, (1, 2), {}), (posonly, (1,), {"b": 2, "c": 3}),
    (make_closure(), (torch.ones(2),), {}), (make_closure(), (torch.ones(2),), {"y": 3}),
    (make_empty_cell(), (1,), {}), (M().method, (4,), {}), (M().method, (4,), {"scale": 3}),
    (M().forward, (), {"pixel_values": 1}), (M().forward, (1, 2), {"return_dict": True, "extra": 3}),
    (M().forward, (), {}), (varargs, (1,), {}), (varargs, (1, 2, 3), {"k": 4, "z": 5}),
    (varargs, (), {"a": 1, "q": 2}), (posonly_kw, (1,), {"a": 2}),
    (lambda x, *, k: x, (1,), {"k": 2}),
]
DECLINED = [(plain, (1,), {}), (plain, (1, 2), {"a": 1}), (plain, (1, 2, 3, 4, 5), {}),
            (plain, (1, 2), {"e": 1}), (posonly, (), {"a": 1, "b": 2}),
            (M().forward, (1, 2, 3), {}), (M().forward, (1,), {"pixel_values": 2}),
            (varargs, (), {}), (lambda x, *, k: x, (1,), {})]


@pytest.mark.parametrize("i", range(len(CALLS)))
def test_fast_locals_match_the_general_binding(i):
    fn, args, kwargs = CALLS[i]
    build = _fast_locals_builder(fn)
    assert build is not None
    fast, general = build(args, kwargs), frame_locals(fn, args, kwargs)
    assert list(fast) == list(general)  # the same names in the same order
    for name in general:
        if isinstance(general[name], (tuple, dict)) and name in ("rest", "kw", "kwargs"):
            assert type(fast[name]) is type(general[name]) and fast[name] == general[name], name
        else:
            assert fast[name] is general[name], name


@pytest.mark.parametrize("i", range(len(DECLINED)))
def test_calls_it_cannot_bind_go_to_the_general_binding(i):
    fn, args, kwargs = DECLINED[i]
    assert _fast_locals_builder(fn)(args, kwargs) is None
    with pytest.raises(TypeError):
        frame_locals(fn, args, kwargs)


def test_a_signature_attribute_does_not_change_the_frame_binding():
    """CPython binds a frame by its code; a ``__signature__`` on the function (the kernels
    package gives its ``Func.forward(self, *args, **kwargs)`` the kernel's) is not read."""
    import inspect

    def f(x, y=1):
        return x
    f.__signature__ = inspect.Signature([inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    assert _fast_locals_builder(f)((0, 2), {}) == frame_locals(f, (0, 2), {}) == {"x": 0, "y": 2}
    assert _fast_locals_builder(torch.sin) is None


def test_varargs_forward_with_a_signature_breaks_and_resumes():
    """A module forward ``(self, *args, **kwargs)`` carrying a narrower ``__signature__``,
    compiled on its own at a graph break: its frame gets ``args``, and nothing runs eagerly."""
    import inspect

    import kiln

    def inner(x):
        y = x * 2
        kiln.graph_break()
        return y + 1

    class Func(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return inner(*args, **kwargs)
    Func.forward.__signature__ = inspect.signature(lambda self, x: None)
    f = Func()

    def outer(x):
        return f(x) * 3
    kiln.reset()
    out = kiln.explain(outer, backend="eager")(torch.ones(2))
    assert not out.eager_runs, out.eager_runs
    torch.testing.assert_close(out.result, outer(torch.ones(2)))


def test_defaults_are_read_at_call_time():
    def f(x, y=1, *, k=2):
        return x
    build = _fast_locals_builder(f)
    f.__defaults__, f.__kwdefaults__ = (5,), {"k": 6}
    assert build((0,), {}) == frame_locals(f, (0,), {}) == {"x": 0, "y": 5, "k": 6}


def test_a_compiled_closure_sees_its_cell_change():
    scale = 2.0

    def f(x, bias=1.0):
        return x * scale + bias
    g = kiln.compile(f)
    x = torch.randn(8)
    torch.testing.assert_close(g(x), f(x))
    torch.testing.assert_close(g(x, bias=3.0), f(x, bias=3.0))
    scale = 5.0  # noqa: F841 - read through f's cell
    torch.testing.assert_close(g(x), f(x))
    torch.testing.assert_close(g(x, 0.5), f(x, 0.5))
