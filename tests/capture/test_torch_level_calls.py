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
