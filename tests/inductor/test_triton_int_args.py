"""Triton passes an int argument equal to 1 as a constexpr Python int (its specialization), so
generated code must not call tensor methods such as ``.to()`` on a value built only from size
symbols. The interpreter does not specialize, so the kernel is compiled here by Triton's real
front end for a CUDA target (ptxas is installed with triton; no GPU is needed), with each size
symbol equal to 1 and to 16 (Triton's other specialization, divisibility)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from testing import INTERPRET

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))
from test_build_pool import _nvidia_backend  # noqa: E402

pytestmark = pytest.mark.skipif(not (INTERPRET and _nvidia_backend()),
                                reason="needs Triton with its CUDA backend")

# Warm up (compile, not run) every kernel in a module for a fake H100-class device: pointers get
# a CPU tensor, every int argument the given value.
WARMUP = textwrap.dedent("""
    import importlib.util, inspect, sys, torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    class D:
        def get_current_device(self): return 0
        def get_current_stream(self, d=None): return 0
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
    driver.set_active(D())
    spec = importlib.util.spec_from_file_location("kiln_int_args", sys.argv[1])
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    value = int(sys.argv[2])
    x = torch.empty(64)
    for name, fn in vars(m).items():
        if not isinstance(fn, triton.runtime.JITFunction):
            continue
        params = [p.name for p in fn.params if not p.is_constexpr]
        args = [x if "ptr" in p else value for p in params]
        fn.warmup(*args, XBLOCK=16, grid=(1,), num_warps=4)
""")


def _sizes_as_values(x):
    return x * x.shape[1] + x.shape[0]


@pytest.mark.parametrize("value", [1, 16])
def test_a_size_symbol_used_as_a_value_compiles_when_triton_specializes_it(tmp_path, value):
    x = torch.randn(4, 8)
    with kiln.config.patch(cpu_backend="triton"):
        out = kiln.explain(_sizes_as_values, dynamic=True)(x)
    source = "\n".join(k.source for k in out.kernels)
    assert "s1" in source and "s0" in source  # the sizes are kernel arguments, not constants
    path = tmp_path / "k.py"
    path.write_text(source)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "tc"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", WARMUP, str(path), str(value)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
