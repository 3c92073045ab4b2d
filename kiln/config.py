"""One Config object; environment overrides; ``kiln.config.patch(...)`` for a scope."""
from __future__ import annotations

import contextlib
import dataclasses
import os


def _env_bool(name, default):
    v = os.environ.get(name)
    return default if v is None else v.strip().lower() not in ("", "0", "false", "no")


@dataclasses.dataclass
class Config:
    # capture
    recompile_limit: int = 8
    # checking
    verify: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_VERIFY", False))
    strict: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_STRICT", False))
    disable: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_DISABLE", False))
    # inductor
    cpu_backend: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_CPU_BACKEND", "cpp"))
    triton_max_persistent_rblock: int = 4096  # longer rows use looped reductions
    triton_looped_rblock: int = 1024
    cpp_flags: tuple = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
    cpp_compiler: str = dataclasses.field(default_factory=lambda: os.environ.get("CXX", "g++"))
    # runtime
    cache_dir: str = dataclasses.field(default_factory=lambda: os.environ.get(
        "KILN_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "kiln")))
    # observe
    debug: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_DEBUG", False))
    debug_dir: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_DEBUG_DIR", "kiln_debug"))

    @contextlib.contextmanager
    def patch(self, **overrides):
        unknown = [k for k in overrides if not hasattr(self, k)]
        if unknown:
            raise AttributeError(f"kiln.config has no setting(s) {unknown}")
        old = {k: getattr(self, k) for k in overrides}
        for k, v in overrides.items():
            setattr(self, k, v)
        try:
            yield self
        finally:
            for k, v in old.items():
                setattr(self, k, v)


config = Config()
