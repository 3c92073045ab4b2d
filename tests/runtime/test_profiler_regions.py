"""Compiled calls in the user's own torch.profiler trace: each call is a region named
``kiln: <fn> [<compile id>]`` with its kernels (and the eager ops its wrapper calls) under it;
with no profiler on, the call path records nothing and the kernels are called directly."""
import pytest
import torch

import kiln
from kiln import api
from kiln.config import config
from kiln.runtime import profiler_regions
from testing import CUDA, INTERPRET, _triton_ok, assert_close

# (device, CPU backend): C++ kernels, Triton's interpreter (only where TRITON_INTERPRET is on:
# on a CUDA machine Triton compiles for the GPU and CPU tensors cannot reach it), and Triton on
# the GPU
CASES = ([("cpu", "cpp")] + ([("cpu", "triton")] if INTERPRET and _triton_ok() else [])
         + ([("cuda", "cpp")] if CUDA else []))


def mixed(x, y):
    return torch.relu(x + y) * 2 + (x @ y).sum()


def _namespaces(compiled):
    """The generated wrappers' namespaces of every entry compiled for ``compiled``."""
    out = []
    for entry in compiled.cache.entries:
        call = entry.call
        if hasattr(call, "__globals__"):
            out.append(call.__globals__)
    return out


def _children(events, parent_name):
    return [e.name for e in events if e.cpu_parent is not None and e.cpu_parent.name == parent_name]


@pytest.mark.parametrize("device,backend", CASES)
def test_compiled_call_is_a_named_region_with_its_kernels_under_it(device, backend):
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with config.patch(cpu_backend=backend):
        c = kiln.compile(mixed)
        x, y = torch.randn(8, 8, device=device), torch.randn(8, 8, device=device)
        c(x, y)  # compiled outside the profiler: the region must not depend on compiling under it
        x, y = torch.randn(8, 8, device=device), torch.randn(8, 8, device=device)
        with torch.profiler.profile(activities=acts) as prof:
            out = c(x, y)
            if device == "cuda":
                torch.cuda.synchronize()
        assert_close(out, mixed(x, y))
    entry = c.cache.entries[0]
    region = f"kiln: mixed [{entry.compile_id}]"
    events = list(prof.events())
    # with CUDA activity on, torch also mirrors each range onto the GPU timeline (a
    # gpu_user_annotation of the same name): count the host-side region
    names = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    assert names.count(region) == 1, names
    under = _children(events, region)
    assert "aten::mm" in under  # the eager op the wrapper calls
    kernels = [n for n in under if n.startswith("kiln kernel: ")]
    assert len(kernels) == entry.compiled.kernel_count >= 1, under
    if device == "cuda":  # the Triton kernels ran on the device, launched inside their ranges
        gpu = {e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA}
        assert any(k.split(": ", 1)[1] in g for k in kernels for g in gpu), (kernels, gpu)


def test_after_profiling_the_kernels_are_plain_again():
    c = kiln.compile(mixed)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    c(x, y)
    with torch.profiler.profile():
        c(x, y)
    (ns,) = _namespaces(c)
    assert any(isinstance(v, profiler_regions._KernelRegion) for v in ns.values())
    assert_close(c(x, y), mixed(x, y))  # the first unprofiled call puts the kernels back
    assert not any(isinstance(v, profiler_regions._KernelRegion) for v in ns.values())
    # and a second profiling session installs them again
    with torch.profiler.profile() as prof:
        c(x, y)
    assert any(n.startswith("kiln kernel: ") for n in (e.name for e in prof.events()))


def test_no_profiler_no_region(monkeypatch):
    def boom(*a):
        raise AssertionError("region entered with no profiler on")
    monkeypatch.setattr(profiler_regions, "run", boom)
    c = kiln.compile(mixed)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    c(x, y)
    assert_close(c(x, y), mixed(x, y))


def test_graph_break_and_module_regions():
    def with_break(x):
        y = x.sin()
        kiln.graph_break()
        return y.cos() + 1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.tanh(self.lin(x))

    cf, m = kiln.compile(with_break), M()
    cm = kiln.compile(m)
    x = torch.randn(3, 4)
    cf(x), cm(x)
    with torch.profiler.profile() as prof:
        a, b = cf(x), cm(x)
    assert_close(a, with_break(x))
    assert_close(b, m(x))
    regions = [e.name for e in prof.events() if e.name.startswith("kiln: ")]
    # the frame before the break, its resume function, and the module's forward
    assert any(r.startswith("kiln: test_graph_break_and_module_regions.<locals>.with_break [") for r in regions)
    assert any("<resume" in r for r in regions), regions
    assert any("forward [" in r for r in regions), regions


def test_registrations_of_dropped_graphs_do_not_pile_up():
    def make():
        ns = {"k0": lambda: None}
        exec("def call():\n    k0()\n", ns)
        return ns["call"]
    for _ in range(1000):
        profiler_regions.register(make(), ["k0"])  # dropped at once: dead weak references
    assert len(profiler_regions._wrappers) <= 2 * max(64, profiler_regions._live[0]) + 1
    keep = make()
    profiler_regions.register(keep, ["k0"])
    with torch.profiler.profile() as prof:
        profiler_regions.install()
        keep()
    assert "kiln kernel: k0" in [e.name for e in prof.events()]
