"""Generated C++ kernels called through kiln's small extension instead of ctypes
(runtime/cpp_call.py): every arity up to MAX passes its integers in order; compiled functions
give eager's answers either way."""
import ctypes
import functools

import pytest
import torch

import kiln
from kiln.runtime import cpp_build, cpp_call
from testing import assert_close


@pytest.fixture
def call():
    why = cpp_call._why_not()
    if why is not None:
        pytest.skip(why)
    fn = cpp_call.caller()
    assert fn is not None
    return fn


def _recorder(n: int):
    params = ", ".join(["int64_t* out"] + [f"int64_t a{i}" for i in range(n)])
    body = " ".join(f"out[{i}] = a{i};" for i in range(n))
    src = f'#include <cstdint>\nextern "C" void rec{n}({params}) {{ {body} out[{n}] = 12345; }}\n'
    return getattr(cpp_build.load_cpp(src), f"rec{n}")


@pytest.mark.parametrize("n", [0, 1, 5, 6, 7, 20, cpp_call.MAX - 1])
def test_every_arity_passes_its_integers_in_order(call, n):
    out = torch.zeros(n + 1, dtype=torch.int64)
    values = [(-1) ** i * (i * 1_000_003 + 7) for i in range(n)]
    call(ctypes.cast(_recorder(n), ctypes.c_void_p).value, n + 1, out.data_ptr(), *values)
    assert out.tolist() == values + [12345]


def test_bad_calls_raise_instead_of_crashing(call):
    addr = ctypes.cast(_recorder(1), ctypes.c_void_p).value
    with pytest.raises(TypeError):
        call()
    with pytest.raises(TypeError, match="takes 2 arguments, 1 given"):
        call(addr, 2, 0)  # a wrapper passing too few never reaches the kernel
    with pytest.raises(TypeError):
        call(addr, cpp_call.MAX + 1, *range(cpp_call.MAX + 1))
    with pytest.raises(TypeError):
        call(addr, 2, 0, "not an int")
    with pytest.raises(ValueError):
        call(0, 0)
    bound = cpp_call.bind(_recorder(1), 2)
    with pytest.raises(TypeError, match="takes 2 arguments, 3 given"):
        bound(0, 1, 2)


def test_bound_kernels_are_partials_that_keep_their_library(call):
    fn = _recorder(2)
    bound = cpp_call.bind(fn, 3)
    assert isinstance(bound, functools.partial) and bound.ctypes_fn is fn
    out = torch.zeros(3, dtype=torch.int64)
    bound(out.data_ptr(), 4, 5)
    assert out.tolist() == [4, 5, 12345]


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_functions_match_eager_either_way(monkeypatch, on, dtype):
    monkeypatch.setattr(kiln.config, "cpp_call", on)
    monkeypatch.setattr(kiln.config, "cpu_backend", "cpp")
    cpp_call.reset()

    def f(*xs):
        out = xs[0]
        for i, x in enumerate(xs[1:]):
            out = out + x * (i + 1)
        return torch.relu(out) * 0.5 + torch.tanh(out)
    # many arguments in fp32; few in bf16, where eager rounds after every one of its ops and
    # a long chain drifts past bf16's tolerance from kiln's single rounding
    xs = [torch.randn(6, 10, dtype=dtype) for _ in range(12 if dtype == torch.float32 else 4)]
    xs[1] = torch.randn(10, 6, dtype=dtype).t()  # non-contiguous
    xs[2] = torch.randn(10, dtype=dtype)          # broadcast
    out = kiln.compile(f)(*xs)
    if dtype == torch.float32:
        assert_close(out, f(*xs), dtype)
    else:
        # kiln computes in fp32 and rounds once: it matches the fp32 computation of the same
        # bf16 inputs to bf16's tolerance; eager rounds after every op, so it is held to be no
        # further from eager than eager itself is from that reference (plus one rounding)
        ref = f(*[x.float() for x in xs])
        assert_close(out.float(), ref.to(dtype).float(), dtype)
        eager = f(*xs).float()
        assert (out.float() - eager).abs().max() <= (eager - ref).abs().max() + 1.6e-2 * ref.abs().max()
    cpp_call.reset()


def test_threads_asking_at_once_share_one_extension(tmp_path, monkeypatch):
    """The build stage's threads ask for the extension together: one builds it, the others get
    the same function, and one entry lands in the cache (a race in sysconfig once gave one
    thread another file suffix, another key, and a second build)."""
    import importlib.machinery
    import sysconfig
    import threading
    if cpp_call._why_not() is not None:
        pytest.skip(cpp_call._why_not())
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    cpp_call.reset()
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: None)  # the raced read
    got, barrier = [], threading.Barrier(6)

    def ask():
        barrier.wait()
        got.append(cpp_call.caller())
    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and got[0] is not None and all(f is got[0] for f in got)
    built = [p for p in tmp_path.rglob("kiln_cpp_call*") if not p.name.endswith(".sha256")]
    assert len(built) == 1 and built[0].name.endswith(importlib.machinery.EXTENSION_SUFFIXES[0])
    cpp_call.reset()
