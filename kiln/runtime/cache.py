"""The content-addressed disk cache (``~/.cache/kiln`` or ``KILN_CACHE_DIR``).

Trust: the cache holds code that kiln runs in the caller's process (graph wrappers it
``exec``s, shared objects it ``dlopen``s, Triton modules it imports), so anyone who can write
it can run code as the user, as with JAX's compilation cache. kiln therefore creates every
folder 0700 and every file 0600 whatever the umask (the parents of ``KILN_CACHE_DIR`` it
creates too), and refuses a cache root, a folder or an entry that is not owned by the current
user or that others can write (or, inside the root, a symbolic link): it warns once, naming
the path and the reason, and compiles into a private temporary cache for the rest of the
process (removed at exit). Folders are checked once per process, entries at each load (an
``lstat``).

Entries: each is a file next to a ``.sha256`` sidecar holding the digest of its bytes. A store
writes both (temp file + ``os.replace`` each) under an exclusive ``flock`` of the entry's
folder (``store_many`` places one file under several keys, each from the caller's own
file); a load verifies the digest and reads or maps the file under a shared one, so a reader
never sees a digest and content that disagree, nor an entry vanish between its check and its
use. A corrupt, truncated or unreadable entry (a directory where a file should be, say) is
reported on the ``cache`` log channel, evicted and rebuilt, never trusted; callers evict
entries that verify but then fail to load or run (``evict``) and rebuild them in the same call.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import warnings

from kiln import log
from kiln.config import config

try:
    import fcntl
except ImportError:  # not POSIX: entries are still written atomically, without the folder lock
    fcntl = None

KILN_CACHE_VERSION = "1"
DIR_MODE, FILE_MODE = 0o700, 0o600

_lock = threading.Lock()
_roots: dict[str, str] = {}    # configured cache_dir -> the root in use (itself, or a private one)
_trusted: set = set()          # folders checked this process
_private: list = []            # the private temporary root, once made
_refused: set = set()          # refused configured roots (absolute)


class UntrustedCache(OSError):
    """A cache path owned by someone else or writable by others (the cache was refused)."""


# ---------------------------------------------------------------------- folders and trust
def make_private_dirs(path: str):
    """``os.makedirs`` where every folder made (parents included) is 0700, whatever the umask
    (``os.makedirs`` gives the parents it makes 0777 less the umask)."""
    path = os.path.abspath(path)
    missing = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another thread or process: checked like any other
        os.chmod(d, DIR_MODE)  # the umask may have taken bits mkdir was asked for


def _why_untrusted(path: str, st) -> str | None:
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by {'group and others' if st.st_mode & 0o022 == 0o022 else 'group' if st.st_mode & 0o020 else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _check_dir(path: str, follow: bool = False) -> str | None:
    """Why the folder ``path`` cannot be trusted, or None (memoized when it can)."""
    if path in _trusted:
        return None
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return None  # nothing there to trust yet (a miss); checked again once made
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    why = _why_untrusted(path, st)
    if why is None:
        _trusted.add(path)
    return why


def _private_root() -> str:
    if not _private:
        root = tempfile.mkdtemp(prefix="kiln-private-cache-")  # 0700, this user's
        _private.append(root)
        _trusted.add(root)
        atexit.register(shutil.rmtree, root, True)
    return _private[0]


def _refuse(path: str, why: str, configured: str) -> str:
    root = _private_root()
    _roots[configured] = root
    _refused.add(os.path.abspath(configured))
    msg = (f"kiln: refusing the compile cache at {path}: {why}; anyone who can write the cache "
           f"can run code as you. Compiling into the private temporary cache {root} for this process")
    log.log("cache", "%s", msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=4)
    return root


def cache_root() -> str:
    """The cache root in use: ``config.cache_dir`` when this user owns it and no one else can
    write it, else (with one warning) a private temporary one."""
    configured = config.cache_dir
    root = _roots.get(configured)
    if root is not None:
        return root
    with _lock:
        root = _roots.get(configured)
        if root is None:
            path = os.path.abspath(configured)
            try:
                make_private_dirs(path)
                why = _check_dir(path, follow=True)  # a root may be a link to the user's own folder
            except OSError as e:
                why = f"it cannot be made ({e.strerror or e})"
            root = _refuse(path, why, configured) if why else path
            _roots[configured] = root
    return root


def _folders_of(path: str) -> list:
    """The folders to check for a file at ``path``: those from the root in use (exclusive)
    down to its folder, or only its folder when ``path`` is outside the cache (a test's, or a
    user's own ``TRITON_CACHE_DIR``). A path under a refused cache is untrusted."""
    p = os.path.abspath(path)
    root = cache_root()
    d = os.path.dirname(p)
    if not d.startswith(root + os.sep) and d != root:
        for refused in _refused:
            if p.startswith(refused + os.sep):
                raise UntrustedCache(f"{path}: it is inside the refused cache {refused}")
        return [d]
    chain = []
    while d != root:
        chain.append(d)
        d = os.path.dirname(d)
    return chain[::-1]


def _refuse_inside(path: str, why: str):
    configured = config.cache_dir
    with _lock:
        if _roots.get(configured) not in _private:
            _refuse(path, why, configured)
    raise UntrustedCache(f"{path}: {why}")


def _trust_dirs(path: str):
    """Raise UntrustedCache (after refusing the cache) unless every folder between the root
    and ``path`` is this user's and private."""
    for d in _folders_of(path):
        why = _check_dir(d)
        if why is not None:
            _refuse_inside(d, why)


def _trust_file(path: str):
    """Raise UntrustedCache (after refusing the cache) when the file ``path`` exists and is a
    link, another user's or writable by others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    why = "it is a symbolic link" if stat.S_ISLNK(st.st_mode) else _why_untrusted(path, st)
    if why is not None:
        _refuse_inside(path, why)


def check_trusted(path: str):
    """Raise UntrustedCache unless ``path`` (a file kiln will load, under the cache root) and
    its folders pass the trust check."""
    _trust_dirs(path)
    _trust_file(path)


def subdir(name: str) -> str:
    path = os.path.join(cache_root(), name)
    if path not in _trusted:
        make_private_dirs(path)
        why = _check_dir(path)
        if why is not None:
            try:
                _refuse_inside(path, why)
            except UntrustedCache:
                return subdir(name)  # the same folder of the private root
    return path


def reset_trust():
    """Forget the checks of this process (tests that change permissions between compiles)."""
    with _lock:
        _roots.clear()
        _trusted.clear()
        _refused.clear()
        if _private:
            _trusted.add(_private[0])


# ---------------------------------------------------------------------- keys and digests
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


# ---------------------------------------------------------------------- writing and reading
@contextlib.contextmanager
def _folder_lock(folder: str, exclusive: bool):
    """An flock of the entry's folder: stores exclusive, loads shared (no-op where folders
    cannot be locked)."""
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(folder, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _replace_with(path: str, data: bytes):
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _prepare_dir(path: str) -> str:
    d = os.path.dirname(os.path.abspath(path))
    if d not in _trusted:
        _folders_of(path)  # (raises inside a refused cache, before making anything there)
        make_private_dirs(d)
    _trust_dirs(path)
    return d


def write_atomic(path: str, data: bytes):
    """``path`` holds ``data`` (0600), replaced in one step."""
    d = _prepare_dir(path)
    with _folder_lock(d, exclusive=True):
        _replace_with(path, data)


def store(path: str, data: bytes):
    """Write the entry ``path`` and its digest, atomically against every load of it."""
    d = _prepare_dir(path)
    with _folder_lock(d, exclusive=True):
        _replace_with(path, data)
        _replace_with(path + ".sha256", hashlib.sha256(data).hexdigest().encode())


def store_many(paths: list, data: bytes):
    """The entries ``paths``, each with the bytes ``data`` and their digest: one file,
    hard-linked (one mapping when loaded), or copies where links are not possible. Every entry
    is placed from this caller's own file, never from another entry's path: a concurrent store
    may replace that entry meanwhile with other bytes that are right for its key only (the
    object of one kernel built alone, where ``data`` holds several), which would land under
    the other keys, lacking their symbols."""
    digest = hashlib.sha256(data).hexdigest().encode()
    own = None
    try:
        for path in paths:
            d = _prepare_dir(path)
            with _folder_lock(d, exclusive=True):
                if own is None:
                    fd, own = tempfile.mkstemp(dir=d, prefix=".tmp-")  # 0600
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                tmp = os.path.join(d, f".tmp-link-{os.getpid()}-{threading.get_ident()}-{os.path.basename(path)}")
                try:
                    os.link(own, tmp)
                    os.replace(tmp, path)
                except OSError:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    _replace_with(path, data)
                _replace_with(path + ".sha256", digest)
    finally:
        if own is not None and os.path.exists(own):
            os.unlink(own)


def commit_entry(path: str):
    """Record the digest of an entry written with ``write_atomic`` (prefer ``store``)."""
    d = _prepare_dir(path)
    with _folder_lock(d, exclusive=True):
        _replace_with(path + ".sha256", digest_file(path).encode())


def _remove(path: str):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def _verify(path: str) -> str | None:
    """Why the entry is not usable, or None; "missing" for no entry at all."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a plain file"
    try:
        with open(path + ".sha256") as f:
            expected = f.read().strip()
    except OSError:
        return "digest missing"
    try:
        actual = digest_file(path)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return None if actual == expected else "digest mismatch"


@contextlib.contextmanager
def reading(path: str):
    """``with reading(path) as ok:`` ok is True when the entry exists, is trusted and matches
    its digest; the caller reads or loads it inside the block, where no store or eviction of
    its folder can interleave. A bad entry is logged and evicted (ok False); an untrusted one
    refuses the cache (ok False: the caller rebuilds into the private root)."""
    try:
        check_trusted(path)
    except UntrustedCache:
        yield False
        return
    d = os.path.dirname(os.path.abspath(path))
    why = None
    if os.path.isdir(d):
        with _folder_lock(d, exclusive=False):
            why = _verify(path)
            if why is None:
                yield True
                return
    if why not in (None, "missing"):
        evict(path, why, log_as="corrupt cache entry")
    yield False


def valid_entry(path: str) -> bool:
    """True if path exists, is trusted and matches its recorded digest; a bad entry is removed."""
    with reading(path) as ok:
        return ok


def evict(path: str, why: str, log_as: str = "unusable cache entry"):
    """Remove the entry ``path`` and its digest (logged on ``cache``): it is rebuilt. Under the
    folder's exclusive lock, and only if it is still the entry that failed (a concurrent store
    may have replaced it with a good one meanwhile, which stays)."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        return
    log.log("cache", "%s %s (%s); rebuilding it", log_as, path, why)
    with _folder_lock(d, exclusive=True):
        if why in ("digest mismatch", "digest missing", "not a plain file") or why.startswith("unreadable"):
            if _verify(path) is None:
                return  # replaced by a good entry while this one waited for the lock
        for p in (path, path + ".sha256"):
            _remove(p)
