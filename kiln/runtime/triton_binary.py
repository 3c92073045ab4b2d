"""Triton binaries loaded without Triton's JIT: kiln's own record of each compiled kernel.

A launch through Triton's JIT binds and specializes the arguments, then computes the compile's
cache key, and the first key of a process hashes Triton's own sources and libraries (most of
the parent's first launch of a warm start). Only then does it find the
binary in Triton's disk cache.

kiln writes a small record per compiled kernel instead, in its own disk cache, keyed by what
decides the binary:

- the kernel's module, which is named by a digest of its source, and the function's name;
- per argument: a pointer's dtype and 16-byte alignment; an integer's value 1, its divisibility
  by 16 and its range (i32, i64, u64); a float or a bool;
- the constexpr keywords (block sizes, ``num_warps``), the GPU's architecture, and a stamp of
  this Triton: its version, its library's size and mtime, and the ``TRITON_*`` environment.

The record names the binary's files in Triton's cache (its ``metadata_group``), the compile's
hash, the digests of the metadata and the binary, and the compile's source description (the
``ASTSource`` fields the launcher is built from). A launch with a record builds the
``CompiledKernel`` from those files, the way Triton itself does on a cache hit. A record that is
missing, corrupt, or from another Triton, or a kernel that fails to load, takes the JIT path,
which compiles or loads what it sees. This key is finer than Triton's own specialization, never
coarser, so a record can only miss, never load the wrong binary.

Records are written by the build workers (``triton_aot``: the cold compile's first launch then
skips the JIT too) and by the first JIT launch of a kernel that has none.
"""
from __future__ import annotations

import json
import os
import threading

from kiln import counters, log
from kiln.runtime import cache
from kiln.runtime.triton_record import RecordError, decode, describe, digest_file

_memo: dict = {}  # (record key, device) -> loaded CompiledKernel
_lock = threading.Lock()
_stamp: list = []
_arch: dict = {}


# ------------------------------------------------------------------ the key
def _triton_stamp() -> str:
    """This Triton and its environment, once per process (the ``TRITON_*`` variables are read
    at the first launch; Triton's own compile options come from them)."""
    if not _stamp:
        import triton  # optional dependency: loaded only for Triton kernels
        lib = os.path.join(os.path.dirname(triton.__file__), "_C")
        facts = [triton.__version__, os.path.dirname(triton.__file__)]
        try:
            for name in sorted(os.listdir(lib)):
                st = os.stat(os.path.join(lib, name))
                facts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            pass
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith("TRITON_") and k != "TRITON_CACHE_DIR")
        _stamp.append("|".join(facts) + repr(env))
    return _stamp[0]


def arch_of(device: int) -> str:
    a = _arch.get(device)
    if a is None:
        import torch
        major, minor = torch.cuda.get_device_capability(device)
        a = _arch[device] = f"cuda:{major * 10 + minor}"
    return a


def int_facts(v: int) -> list:
    return ["i", v == 1, v % 16 == 0, -2 ** 31 <= v < 2 ** 31, v >= 2 ** 63]


def runtime_facts(args) -> list | None:
    """The facts of a launch's arguments that decide the binary, or None for an argument of a
    kind this key does not describe."""
    out = []
    for a in args:
        if hasattr(a, "data_ptr"):
            dtype = getattr(a, "dtype", None)
            if dtype is None:
                return None
            out.append(["p", str(dtype).replace("torch.", ""), a.data_ptr() % 16 == 0])
        elif isinstance(a, bool):
            out.append(["b", a])
        elif isinstance(a, int):
            out.append(int_facts(a))
        elif isinstance(a, float):
            out.append(["f"])
        elif a is None:
            out.append(["n"])
        else:
            return None
    return out


def arch_of_target(target) -> str:
    """The architecture of an ahead-of-time request's target (``["cuda", 90, 32]``)."""
    return f"{target[0]}:{target[1]}"


def predicted_facts(req_args) -> list:
    """The same facts from an ahead-of-time request's argument list (``triton_aot.describe``:
    pointers are predicted aligned)."""
    return [["p", a[1], a[2] % 16 == 0] if a[0] == "ptr" else int_facts(a[1]) for a in req_args]


def record_key(module: str, name: str, facts, kwargs: dict, arch: str) -> str:
    return cache.content_key("triton-binary", module, name, json.dumps(facts),
                             repr(sorted(kwargs.items())), arch, _triton_stamp())


def _path(key: str) -> str:
    return os.path.join(cache.subdir("triton_binary"), key[:2], key + ".json")


def save(key: str, record: dict):
    cache.store(_path(key), json.dumps(record, sort_keys=True).encode())


def _make_private(kernel):
    """Triton's JIT writes its binaries with the process's umask: make the kernel's files 0600
    and their folder 0700 before kiln records them (build workers run under umask 077)."""
    group = getattr(kernel, "metadata_group", None) or {}
    folders = set()
    for p in group.values():
        try:
            if os.stat(p).st_uid == os.geteuid():
                os.chmod(p, 0o600)
                folders.add(os.path.dirname(p))
        except OSError:
            pass
    for d in folders:
        try:
            os.chmod(d, 0o700)
        except OSError:
            pass


def save_from_kernel(key: str, kernel, what: str):
    """Record a kernel the JIT (or a build worker) compiled; best effort."""
    try:
        _make_private(kernel)
        save(key, describe(kernel))
    except Exception as e:  # noqa: BLE001 - the JIT path keeps working without a record
        log.log("kernels", "%s: no binary record (%s: %s)", what, type(e).__name__, e)


# ------------------------------------------------------------------ loading
def construct(record: dict, fn):
    """A ``CompiledKernel`` from a record and the kernel's JIT function (handles not loaded)."""
    from triton.compiler import compiler as tc
    root = os.environ.get("TRITON_CACHE_DIR", "")
    group = {f: (p if os.path.isabs(p) else os.path.join(root, p)) for f, p in record["files"].items()}
    for path in group.values():
        cache.check_trusted(path)  # what the launch maps and runs: this user's, private
    for fname, digest in record["digests"].items():
        if digest_file(group[fname]) != digest:
            raise RecordError(f"{group[fname]} does not match its digest")
    src_cls = getattr(tc, record["src_type"], None)
    if src_cls is None:
        raise RecordError(f"this Triton has no {record['src_type']}")
    src = src_cls.__new__(src_cls)
    src.__dict__.update({k: decode(v) for k, v in record["src"].items()})
    src.fn = fn
    return tc.CompiledKernel(src, group, record["hash"])


def load(key: str, fn, device: int, what: str):
    """The loaded kernel of a record (memoized per device), or None when there is no usable
    record (the caller launches through the JIT)."""
    memo_key = (key, device)
    with _lock:
        k = _memo.get(memo_key)
    if k is not None:
        return k
    path = _path(key)
    try:
        with cache.reading(path) as ok:
            if not ok:
                return None
            with open(path) as f:
                record = json.load(f)
        k = construct(record, fn)
        k.run  # noqa: B018 - loads the module and builds the launcher now, inside this try
    except Exception as e:  # noqa: BLE001 - a stale or foreign record: the JIT decides
        log.log("kernels", "%s: binary record %s unusable, launching through the JIT (%s: %s)", what,
                key[:12], type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None
    counters.bump("triton_binary_loads")
    with _lock:
        _memo[memo_key] = k
    return k


def clear_memory():
    with _lock:
        _memo.clear()
