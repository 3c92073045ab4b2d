"""Load generated Triton kernels: the source goes to a file in the disk cache (Triton's JIT
needs real source files), Triton's own binary cache lives beside it."""
from __future__ import annotations

import importlib.util
import os
import sys
import threading

from kiln import counters, log
from kiln.runtime import cache

_loaded: dict[str, object] = {}
_lock = threading.Lock()


def _triton_version() -> str:
    import triton  # optional dependency: loaded only for Triton kernels
    return triton.__version__


_USER_TRITON_CACHE = "TRITON_CACHE_DIR" in os.environ


def ensure_triton_cache_dir():
    """Triton's binaries live in kiln's cache dir (following config.cache_dir), unless the
    user chose a TRITON_CACHE_DIR of their own."""
    if not _USER_TRITON_CACHE:
        os.environ["TRITON_CACHE_DIR"] = cache.subdir("triton_bin")


def clear_memory():
    with _lock:
        _loaded.clear()


def load_triton(source: str, name: str, tune=None):
    """The @triton.jit function ``name`` defined in ``source``, or an ``autotune.Autotuned``
    over its variants when codegen gave it a tuning spec (``tune``)."""
    from kiln.runtime import autotune, launch
    spec = tune
    if spec is not None:  # each variant launches through its compiled launcher too
        return autotune.Autotuned(spec, [launch.wrap(_load_one(src, name), name) for src, _ in spec.variants])
    return _load_one(source, name)


def _key(source: str) -> str:
    return cache.content_key(source, _triton_version(), os.environ.get("TRITON_INTERPRET", "0"))


def module_name(source: str) -> str:
    return f"kiln_triton_{_key(source)[:16]}"


def _path(source: str) -> str:
    key = _key(source)
    return os.path.join(cache.subdir("triton"), key[:2], key + ".py")


def source_path(source: str) -> str:
    """The kernel's source file in the disk cache (written now if missing, corrupt, or not
    exactly ``source``: the key is the source's own digest, so its bytes are checked as well)."""
    path = _path(source)
    with cache.reading(path) as ok:
        if ok:
            try:
                with open(path, "rb") as f:
                    ok = f.read() == source.encode()
            except OSError:
                ok = False
            if ok:
                counters.bump("disk_cache_hits")
                log.log("cache", "triton kernel %s from disk", os.path.basename(path)[:12])
                return path
    path = _path(source)  # (a refused cache moved the root)
    cache.store(path, source.encode())
    return path


def _import(source: str, name: str):
    path = source_path(source)
    mod_name = module_name(source)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with cache.reading(path) as ok:
            if not ok:
                raise ImportError(f"{path} vanished before its import")
            spec.loader.exec_module(module)
        return getattr(module, name)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise


def _load_one(source: str, name: str):
    ensure_triton_cache_dir()
    key = _key(source)
    with _lock:
        fn = _loaded.get(key)
    if fn is not None:
        return fn
    try:
        fn = _import(source, name)
    except Exception as e:  # noqa: BLE001 - an entry that does not import: rewritten, imported again
        cache.evict(_path(source), f"it does not import: {type(e).__name__}: {e}")
        fn = _import(source, name)
    with _lock:
        _loaded[key] = fn
    return fn
