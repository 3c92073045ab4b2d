"""builder.warm_triton: the parent's Triton driver and cache key warmed in threads at a
compile's start (once per process), joined before the parent touches the driver; off with
KILN_CONFIG=triton_warm=0. The GPU target of a build request comes from torch, not from the driver."""
import sys
import threading
import types

import pytest

import kiln
from kiln.runtime import builder


@pytest.fixture
def fresh_warm(monkeypatch):
    monkeypatch.setattr(builder, "_warm_threads", {})
    return builder


def test_warm_starts_each_thread_once_and_waiting_joins_it(fresh_warm, monkeypatch):
    pytest.importorskip("triton")
    release = threading.Event()
    created = []

    class FakeDriverConfig:
        @property
        def active(self):
            release.wait(5)
            created.append(True)
            return object()
    fake = types.ModuleType("triton.runtime.driver")
    fake.driver = FakeDriverConfig()
    import triton.runtime
    monkeypatch.setattr(triton.runtime, "driver", fake.driver, raising=False)
    fresh_warm.warm_triton(key=False)
    fresh_warm.warm_triton(key=False)                 # a second compile: nothing new
    assert list(fresh_warm._warm_threads) == ["driver"]
    t = fresh_warm._warm_threads["driver"]
    assert t.is_alive() and not created
    release.set()
    fresh_warm.wait_triton_driver()                   # returns once the driver exists
    assert not t.is_alive() and created == [True]


def test_warm_can_be_switched_off(fresh_warm):
    with kiln.config.patch(triton_warm=False):
        fresh_warm.warm_triton()
    assert fresh_warm._warm_threads == {}
    fresh_warm.wait_triton_driver()                   # nothing to wait for


def test_a_failing_driver_is_left_to_the_parent(fresh_warm, monkeypatch):
    pytest.importorskip("triton")

    class Broken:
        @property
        def active(self):
            raise RuntimeError("0 active drivers")
    import triton.runtime
    monkeypatch.setattr(triton.runtime, "driver", Broken(), raising=False)
    fresh_warm.warm_triton(key=False)
    fresh_warm.wait_triton_driver()                   # the thread swallowed it; no exception here


def test_the_build_target_comes_from_torch(monkeypatch):
    import torch

    from kiln.runtime import triton_aot
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    sentinel = types.ModuleType("triton.runtime.driver")  # touching the driver would fail the test
    monkeypatch.setitem(sys.modules, "triton.runtime.driver", sentinel)
    assert triton_aot.current_target() == ["cuda", 90, 32]
