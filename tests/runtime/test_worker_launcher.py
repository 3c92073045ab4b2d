"""The build worker also builds a kernel's C launcher (build_worker._build_launcher) where
Triton generates one per signature, so the parent's first launch finds it in Triton's cache;
where Triton has none, or building it fails, nothing changes (the first launch builds it)."""
import sys
import types

import pytest

from kiln.runtime import build_worker


class _Kernel:
    src, metadata = object(), object()


@pytest.fixture
def fake_nvidia_driver(monkeypatch):
    pytest.importorskip("triton")
    import triton.backends.nvidia  # noqa: F401 - the package the fake module sits in
    mod = types.ModuleType("triton.backends.nvidia.driver")
    monkeypatch.setitem(sys.modules, "triton.backends.nvidia.driver", mod)
    monkeypatch.setattr(sys.modules["triton.backends.nvidia"], "driver", mod, raising=False)
    return mod


def test_a_per_signature_launcher_is_built_in_the_worker(fake_nvidia_driver):
    built = []
    fake_nvidia_driver.make_launcher = lambda *a: "src"
    fake_nvidia_driver.CudaLauncher = lambda src, metadata: built.append((src, metadata))
    k = _Kernel()
    build_worker._build_launcher(k)
    assert built == [(k.src, k.metadata)]


def test_no_per_signature_launcher_no_build(fake_nvidia_driver):
    built = []
    fake_nvidia_driver.CudaLauncher = lambda src, metadata: built.append(src)
    build_worker._build_launcher(_Kernel())  # no make_launcher: a generic launcher (Triton 3.7+)
    assert built == []


def test_a_failing_launcher_build_is_left_to_the_first_launch(fake_nvidia_driver):
    def boom(src, metadata):
        raise RuntimeError("needs a live driver")
    fake_nvidia_driver.make_launcher = lambda *a: "src"
    fake_nvidia_driver.CudaLauncher = boom
    build_worker._build_launcher(_Kernel())  # no exception
    build_worker._build_launcher(None)


def test_the_launcher_build_can_be_switched_off(fake_nvidia_driver, monkeypatch):
    built = []
    fake_nvidia_driver.make_launcher = lambda *a: "src"
    fake_nvidia_driver.CudaLauncher = lambda src, metadata: built.append(src)
    monkeypatch.setenv("_KILN_AOT_LAUNCHERS", "0")  # pool._worker_env: config.aot_launchers
    build_worker._build_launcher(_Kernel())
    assert built == []


def _fresh_early(monkeypatch):
    monkeypatch.setattr(build_worker, "_early", {})


def test_the_launcher_starts_when_the_compile_starts(fake_nvidia_driver, monkeypatch):
    """build_worker._early_launchers: Triton's compile entry point, wrapped, starts a thread
    that builds the launcher from the source's signature while the compile runs; the build
    joins it before its own launcher step."""
    import threading

    import triton.compiler as tc
    _fresh_early(monkeypatch)
    started, release = threading.Event(), threading.Event()
    seen = []

    def launcher(src, metadata):
        seen.append((src, metadata.tensordesc_meta, metadata.num_ctas, metadata.global_scratch_size))
        started.set()
        release.wait(5)
    fake_nvidia_driver.make_launcher = lambda *a: "src"
    fake_nvidia_driver.CudaLauncher = launcher

    def real_compile(src, **kw):
        assert started.wait(5), "the launcher build did not start beside the compile"
        release.set()
        return "kernel"
    monkeypatch.setattr(tc, "compile", real_compile)
    build_worker._early_launchers()
    src = types.SimpleNamespace(signature={"x": "*fp32"}, fn=object())
    assert tc.compile(src, target=None) == "kernel"
    assert seen == [(src, None, 1, 0)]
    build_worker._early.pop("thread").join(5)


def test_a_failing_early_launcher_changes_nothing(fake_nvidia_driver, monkeypatch):
    import triton.compiler as tc
    _fresh_early(monkeypatch)

    def boom(src, metadata):
        raise RuntimeError("the stand-in metadata lacks something")
    fake_nvidia_driver.make_launcher = lambda *a: "src"
    fake_nvidia_driver.CudaLauncher = boom
    monkeypatch.setattr(tc, "compile", lambda src, **kw: "kernel")
    build_worker._early_launchers()
    assert tc.compile(types.SimpleNamespace(signature={}, fn=object())) == "kernel"
    build_worker._early.pop("thread").join(5)


def test_no_early_launcher_without_per_signature_launchers(fake_nvidia_driver, monkeypatch):
    import triton.compiler as tc
    _fresh_early(monkeypatch)
    fake_nvidia_driver.CudaLauncher = lambda src, metadata: None
    original = lambda src, **kw: "kernel"  # noqa: E731
    monkeypatch.setattr(tc, "compile", original)
    build_worker._early_launchers()
    assert tc.compile is original
