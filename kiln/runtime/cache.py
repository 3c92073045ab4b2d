"""The content-addressed disk cache (``~/.cache/kiln`` or ``KILN_CACHE_DIR``).

Every entry is written atomically (temp file + rename) next to a digest of its bytes. On read
the digest is checked; a corrupt or truncated entry is reported on the ``cache`` log channel,
deleted and rebuilt, never trusted.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from kiln import log
from kiln.config import config

KILN_CACHE_VERSION = "1"


def cache_root() -> str:
    root = config.cache_dir
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def subdir(name: str) -> str:
    path = os.path.join(cache_root(), name)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def content_key(*parts) -> str:
    h = hashlib.sha256()
    h.update(KILN_CACHE_VERSION.encode())
    for p in parts:
        h.update(b"\0")
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.hexdigest()


def digest_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: str, data: bytes):
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def commit_entry(path: str):
    """Record the digest of a finished entry (written after the entry itself)."""
    write_atomic(path + ".sha256", digest_file(path).encode())


def valid_entry(path: str) -> bool:
    """True if path exists and matches its recorded digest; a bad entry is removed."""
    if not os.path.exists(path):
        return False
    digest_path = path + ".sha256"
    try:
        with open(digest_path) as f:
            expected = f.read().strip()
    except OSError:
        expected = None
    if expected is not None and expected == digest_file(path):
        return True
    log.log("cache", "corrupt cache entry %s (digest %s); rebuilding it",
            path, "missing" if expected is None else "mismatch")
    for p in (path, digest_path):
        try:
            os.unlink(p)
        except OSError:
            pass
    return False
