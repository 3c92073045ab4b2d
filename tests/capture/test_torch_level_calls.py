"""Calls at torch's own level, as torch.nn.functional makes them: compiling F.layer_norm
itself meets ``torch.layer_norm(..., cudnn_enable)``, and ``f is torch.fmod`` compares torch
callables. Each once ran the frame eagerly."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def _no_eager(fn, *args, **tol):
    got, want = kiln.compile(fn)(*args), fn(*args)
    torch.testing.assert_close(got, want, **tol)
    assert kiln.stats()["eager_runs"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiling_layer_norm_itself(dtype):
    x, w, b = torch.randn(3, 5, 16, dtype=dtype), torch.randn(16, dtype=dtype), torch.randn(16, dtype=dtype)
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    _no_eager(F.layer_norm, x, (16,), w, b, 1e-6, **tol)  # traced into: torch.layer_norm(..., 6 args)


def test_torch_layer_and_group_norm_with_their_cudnn_flag():
    x = torch.randn(2, 6, 4, 4)
    _no_eager(lambda x: torch.layer_norm(x, [4, 4], None, None, 1e-5, False)
              + torch.group_norm(x, 3, None, None, 1e-5, True).sum(), x)


def test_torch_batch_norm_takes_the_affine_parameters_first():
    x = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
    w, b = torch.rand(3) + 0.5, torch.randn(3)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    _no_eager(lambda x: torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, True), x)


def test_is_between_torch_functions():
    ops = {"add": torch.add, "sub": torch.sub, "fmod": torch.fmod, "relu": torch.relu}

    def fn(x):
        return tuple(f(x, 2.0) for f in (ops["add"], ops["sub"], ops["fmod"]) if f is not torch.fmod) \
            + tuple(g(x) for g in (ops["relu"], abs) if g is torch.relu or g is abs)
    _no_eager(fn, torch.randn(7))


def test_is_between_a_builtin_and_a_class_held_as_a_constant():
    """``type(name) is str``: type() of a constant is the constant ``str``, the global ``str``
    a builtin tracker. Session 35 answered False for any callable against a constant, so
    ``collections.namedtuple`` took its ``raise TypeError`` branch and compiled code raised
    where eager does not (PyTorch's test_functions.py test_namedtuple)."""
    import collections

    def fn(x, name):
        r = x
        for t in (type(name) is str, type(3) is int, type(name) is not str, None is len,
                  type(1.5) is float, type(name) is int):
            r = r * 2 if t else r - 1
        return r
    _no_eager(fn, torch.randn(5), "t")

    def made(a, b):
        mytuple = collections.namedtuple("mytuple", ["x", "y", "xy"])
        tmp = mytuple(a, b, a + b)
        return mytuple(tmp.x, tmp[1], tmp.xy + b)
    a, b = torch.randn(3), torch.randn(3)
    got, want = kiln.compile(made)(a, b), made(a, b)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_fallback_whose_schema_returns_new_tensors_is_no_view():
    """``topk``/``sort`` have no capture rule (fallback nodes); their aten schemas return fresh
    tensors, so an in-place write to a result is no write through a possible view (a break in
    every MoE router: ``top_value /= top_value.sum(-1, keepdim=True)``)."""
    from kiln.ops.core_fallback import returns_fresh
    assert returns_fresh("torch.topk") and returns_fresh("Tensor.sort") and returns_fresh("torch.histc")
    assert not returns_fresh("torch.diagonal") and not returns_fresh("Tensor.unfold")
    assert not returns_fresh("torch.nn.functional.glu")  # a Python function: its own aliasing

    def route(x):
        v, i = torch.topk(torch.softmax(x, -1), 2, dim=-1)
        v /= v.sum(-1, keepdim=True)
        counts = torch.histc(i.flatten().float(), bins=4, min=0, max=3)
        return v, i, counts
    x = torch.randn(6, 4)
    got, want = kiln.compile(route)(x), route(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["eager_runs"] == 0, kiln.stats()


def test_is_tensor_of_a_number_and_of_a_tensor():
    """``torch.is_tensor(max_pos)`` of a Python int (XGLM's positions): a constant False, no
    break; of a tensor or a parameter, True."""
    w = torch.nn.Parameter(torch.randn(3))

    def f(x, n):
        a = x * 2 if torch.is_tensor(x) and torch.is_tensor(w) else x
        return a + (1 if torch.is_tensor(n) else n)
    x = torch.randn(3)
    _no_eager(f, x, 4)


def test_numpy_argument_names_as_torch_takes_them():
    """``x.mean(axis=2, keepdim=True)`` (I-BERT's LayerNorm) and ``keepdims=``: torch's parser
    takes NumPy's names for dim and keepdim; capture ran the frame eagerly on them."""
    def f(x):
        return x.mean(axis=2, keepdim=True) + torch.sum(x, axis=(0, 1), keepdims=True) - x.amax(axis=-1, keepdims=True)
    _no_eager(f, torch.randn(2, 3, 5))


def test_modules_in_a_set_by_identity():
    """``m not in memo`` over a set of modules (nn.Module.named_modules' memo): by identity."""
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

    def f(x):
        seen = {a}
        out = x
        for m in (a, b, a):
            if m not in seen or m is a:
                seen.add(m)
                out = m(out)
        return out, len(seen)
    x = torch.randn(2, 3)
    with torch.no_grad():
        got, want = kiln.compile(f)(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == 2
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["eager_runs"] == 0, kiln.stats()


@pytest.mark.parametrize("nd, k, dilation", [(2, (4, 3), 1), (2, 3, 2), (1, 4, 1), (3, 2, 1), (2, (5, 2), (1, 3))])
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_convolution_with_a_padding_string(nd, k, dilation, padding):
    """``padding="same"``/``"valid"`` (HF EfficientNet: 205 graphs, 208 breaks): explicit
    padding, an odd remainder padded on the right first, as torch does."""
    torch.manual_seed(0)
    conv = getattr(F, f"conv{nd}d")
    x = torch.randn(2, 3, *([7] * nd)).transpose(0, 1).contiguous().transpose(0, 1)  # strided batch
    w = torch.randn(4, 3, *((k,) * nd if isinstance(k, int) else k))
    _no_eager(lambda x: conv(x, w, None, 1, padding, dilation), x, rtol=1e-4, atol=1e-4)


def test_same_padding_of_a_strided_convolution_raises_as_eager():
    w = torch.randn(4, 3, 3, 3)
    with pytest.raises(RuntimeError, match="strided"):  # eager's own error
        kiln.compile(lambda x: F.conv2d(x, w, None, 2, "same"))(torch.randn(1, 3, 8, 8))


def test_dict_fromkeys_and_python_types_as_dtypes():
    """``dict.fromkeys(range(n))`` and ``torch.tensor(0, dtype=int)`` (transformers' Mamba
    cache, built in the forward): no break; a Python type is the dtype torch reads it as."""
    def f(x):
        states = dict.fromkeys(range(3))
        scale = dict.fromkeys(["a", "b"], 2.0)
        states[1] = x * scale["a"]
        count = torch.tensor(0, dtype=int) + torch.zeros(2, dtype=float).sum().to(torch.int64)
        flags = torch.ones(2, dtype=bool)
        return states[1], count, flags, len(states), states[0] is None
    _no_eager(f, torch.randn(4))
    got = kiln.compile(f)(torch.randn(4))
    assert got[1].dtype == torch.int64 and got[2].dtype == torch.bool


def test_a_numpy_ufunc_of_python_numbers_is_computed_at_capture():
    """``x *= np.sqrt(d_model)`` (CTRL's embeddings; Dynamo breaks there): a NumPy ufunc of
    Python numbers is a constant, its scalar result the Python number torch reads; of a
    tensor it stays a break with eager's answer."""
    np = pytest.importorskip("numpy")
    d_model = 48

    def f(x):
        x = x * 1.0
        x *= np.sqrt(d_model)
        return x + np.exp(0.5) * np.maximum(2, 3)
    x = torch.randn(3, 4)
    _no_eager(f, x)
    assert kiln.compile(f)(x).dtype == f(x).dtype == torch.float32
    t = torch.rand(3)
    got = kiln.compile(lambda t: np.sqrt(t) + 1)(t)  # of a tensor: a break, eager's answer
    assert np.allclose(got, np.sqrt(t.numpy()) + 1)
