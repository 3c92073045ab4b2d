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
    monkeypatch.setenv("KILN_AOT_LAUNCHERS", "0")
    build_worker._build_launcher(_Kernel())
    assert built == []
