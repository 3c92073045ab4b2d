"""Build generated C++ with gcc into a shared object and load it with ctypes."""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import subprocess
import tempfile
import threading
import time

from kiln import counters, log
from kiln.config import config
from kiln.runtime import cache, cpp_pch as pch

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class CppBuildError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CppBuildError(f"[build] C++ compiler {cxx!r} is not usable: {e}") from e


def _build(source: str, so_path: str):
    cxx = config.cpp_compiler
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-") as tmp:
        src = os.path.join(tmp, "kernel.cpp")
        out = os.path.join(tmp, "kernel.so")
        t0 = time.perf_counter()
        header = pch.header_for(source)
        proc = None
        if header is not None:  # the prelude from the precompiled header instead of parsing it
            with open(src, "w") as f:
                f.write(pch.without_prelude(source))
            cmd = [cxx, *config.cpp_flags, "-include", header, src, "-o", out]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                pch.failed(proc.stderr)
        if proc is None or proc.returncode != 0:
            with open(src, "w") as f:
                f.write(source)
            cmd = [cxx, *config.cpp_flags, src, "-o", out]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CppBuildError(f"[build] g++ failed ({' '.join(cmd)}):\n{proc.stderr}\n--- source ---\n{source}")
        with open(out, "rb") as f:
            cache.write_atomic(so_path, f.read())
        cache.commit_entry(so_path)
        log.detail("kernels", "built %s in %.0f ms%s", so_path, (time.perf_counter() - t0) * 1e3,
                   " (precompiled prelude)" if header is not None else "")
    counters.bump("kernel_builds")


def clear_memory():
    with _lock:
        _loaded.clear()


def load_cpp(source: str) -> ctypes.CDLL:
    """The shared object for source: from memory, from the disk cache, or built now."""
    key = cache.content_key(source, config.cpp_compiler, compiler_version(config.cpp_compiler),
                            " ".join(config.cpp_flags), platform.machine())
    with _lock:
        lib = _loaded.get(key)
    if lib is not None:
        return lib
    so_path = os.path.join(cache.subdir("cpp"), key[:2], key + ".so")
    if cache.valid_entry(so_path):
        counters.bump("disk_cache_hits")
        log.log("cache", "cpp kernel %s from disk", key[:12])
        log.detail("cache", "  %s", so_path)
    else:
        log.log("cache", "cpp kernel %s not cached: building it", key[:12])
        log.detail("cache", "  -> %s", so_path)
        _build(source, so_path)
    lib = ctypes.CDLL(so_path)
    with _lock:
        _loaded[key] = lib
    return lib


def load_cpp_function(source: str, name: str, nargs: int, nsizes: int = 0):
    """``nargs`` pointers, then ``nsizes`` int64 symbolic sizes: a ctypes function, called
    through ``cpp_call``'s extension where it is available."""
    from kiln.runtime import cpp_call
    fn = getattr(load_cpp(source), name)
    fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_int64] * nsizes
    fn.restype = None
    return cpp_call.bind(fn, nargs + nsizes)


def load_cpp_checker(source: str, name: str):
    fn = getattr(load_cpp(source), f"{name}_check")
    fn.argtypes = []
    fn.restype = ctypes.c_int
    return fn


def load_cpp_threads(source: str, name: str):
    """``<name>_threads()`` of a chunk-tuned kernel: its OpenMP thread count."""
    fn = getattr(load_cpp(source), f"{name}_threads")
    fn.argtypes = []
    fn.restype = ctypes.c_int
    return fn
