"""The record of one compiled Triton kernel (see ``triton_binary.py``), as plain JSON.

Imports neither kiln nor torch: the build workers (``build_worker.py``) load this file by its
path to describe what they compiled, and the parent imports it as a module.
"""
import enum
import hashlib
import importlib
import os


class RecordError(ValueError):
    pass


def encode(v):
    """JSON for the values of Triton's source description: tuples and dicts with non-string
    keys are tagged."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {"t": [encode(x) for x in v]}
    if isinstance(v, list):
        return [encode(x) for x in v]
    if isinstance(v, dict):
        return {"d": [[encode(k), encode(x)] for k, x in v.items()]}
    if isinstance(v, enum.Enum):  # Triton 3.9's source language
        return {"e": [type(v).__module__, type(v).__qualname__, v.name]}
    raise RecordError(f"cannot record a {type(v).__name__} ({v!r})")


def decode(v):
    if isinstance(v, list):
        return [decode(x) for x in v]
    if isinstance(v, dict):
        if "t" in v:
            return tuple(decode(x) for x in v["t"])
        if "e" in v:
            module, qualname, name = v["e"]
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            return cls[name]
        return {decode(k): decode(x) for k, x in v["d"]}
    return v


def digest_file(path: str) -> str:
    # cache.digest_file, repeated: build workers load this file by its path and import no kiln
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def binary_ext(kernel) -> str:
    asm = getattr(kernel, "asm", None) or {}
    for ext in ("cubin", "hsaco"):
        if ext in asm:
            return ext
    return "cubin"


def describe(kernel) -> dict:
    """The record of a compiled kernel: its files in Triton's cache (relative to
    ``TRITON_CACHE_DIR`` when under it), the digests of its metadata and binary, the compile's
    hash and its source description less the function. Raises RecordError when this Triton's
    kernel cannot be described."""
    group = getattr(kernel, "metadata_group", None)
    src = getattr(kernel, "src", None)
    if not group or src is None or not hasattr(src, "__dict__") or not getattr(kernel, "hash", None):
        raise RecordError("this Triton's compiled kernel has no metadata group, source or hash")
    root = os.path.abspath(os.environ["TRITON_CACHE_DIR"]) if os.environ.get("TRITON_CACHE_DIR") else ""
    ext = "." + binary_ext(kernel)
    files, digests = {}, {}
    for fname, path in group.items():
        path = os.path.abspath(path)
        files[fname] = os.path.relpath(path, root) if root and path.startswith(root + os.sep) else path
        if fname.endswith(".json") or fname.endswith(ext):
            digests[fname] = digest_file(path)
    if not any(f.endswith(".json") for f in digests) or not any(f.endswith(ext) for f in digests):
        raise RecordError("the metadata group lacks its metadata or its binary")
    fields = {k: encode(v) for k, v in vars(src).items() if k != "fn"}
    return {"hash": kernel.hash, "files": files, "digests": digests, "src_type": type(src).__name__,
            "src": fields}
