"""Build generated C++ with gcc into a shared object and load it with ctypes."""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings

from kiln import counters, log
from kiln.config import config
from kiln.runtime import cache, cpp_pch as pch

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class CppBuildError(RuntimeError):
    pass


class CompilerCrash(CppBuildError):
    """The compiler timed out or was killed by a signal: the build is not tried another way
    (a hung compiler would hang again), and the graph falls back."""


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True,
                              timeout=_timeout()).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise CppBuildError(f"[build] C++ compiler {cxx!r} is not usable: {e}") from e


def _timeout() -> float | None:
    return config.build_timeout if config.build_timeout and config.build_timeout > 0 else None


def write_private(path: str, text: str):
    """A file only this user can read (0600 whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def run_compiler(cmd: list) -> subprocess.CompletedProcess:
    """Run one compiler command, bounded by ``config.build_timeout``. A timeout or a signal
    raises CompilerCrash naming the cause in one line ("g++ killed by SIGKILL after 0.3 s");
    the driver reporting that it lost its compiler proper to a signal (``cc1plus``) counts too."""
    name, t0 = os.path.basename(cmd[0]), time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_timeout(), umask=0o077)
    except subprocess.TimeoutExpired as e:
        err = CompilerCrash(f"{name} timed out after {time.perf_counter() - t0:.1f} s (killed)")
        err.stderr = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr) or ""
        raise err from None
    except OSError as e:
        raise CppBuildError(f"{name} could not run: {e}") from e
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        err = CompilerCrash(f"{name} killed by {sig} after {time.perf_counter() - t0:.1f} s")
        err.stderr = proc.stderr
        raise err
    m = re.search(r"(\S+) signal terminated program (\S+)", proc.stderr or "")
    if proc.returncode != 0 and m:
        err = CompilerCrash(f"{name}: {m.group(2)} killed by signal {m.group(1)} after "
                            f"{time.perf_counter() - t0:.1f} s")
        err.stderr = proc.stderr
        raise err
    return proc


def _gcc(tmp: str, full: str, stripped: str, header: str | None):
    """Compile a translation unit into ``tmp``: with the precompiled prelude (``stripped``, the
    unit without its prelude, and ``-include header``) when there is a header, else, or when
    that fails, the whole unit ``full``. A header that fails where the plain unit builds is
    given up for the process (``cpp_pch.failed``); a unit that fails both ways keeps it (the
    unit was broken, not the header). A compiler that times out or is killed is not run
    again (CompilerCrash). Returns (the finished process, its command, the .so)."""
    cxx = config.cpp_compiler
    src, out = os.path.join(tmp, "kernel.cpp"), os.path.join(tmp, "kernel.so")
    with_header = None
    if header is not None:
        write_private(src, stripped)
        cmd = [cxx, *config.cpp_flags, "-include", header, src, "-o", out]
        with_header = run_compiler(cmd)
        if with_header.returncode == 0:
            return with_header, cmd, out
    write_private(src, full)
    cmd = [cxx, *config.cpp_flags, src, "-o", out]
    proc = run_compiler(cmd)
    if with_header is not None and proc.returncode == 0:
        pch.failed(with_header.stderr)
    return proc, cmd, out


def dump_failure(what: str, source: str, log_text: str) -> str:
    """Write a failed build's source (and the compiler's output beside it, ``.log``) where the
    one-line warning can point: ``<cache>/failed/``, or a private temporary file."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", what)[:80] + "-" + cache.content_key(source)[:12]
    try:
        path = os.path.join(cache.subdir("failed"), name + ".cpp")
        cache.write_atomic(path, source.encode())
        cache.write_atomic(path[:-4] + ".log", log_text.encode())
        return path
    except OSError:
        fd, path = tempfile.mkstemp(prefix=f"kiln-failed-{name}-", suffix=".cpp")
        with os.fdopen(fd, "w") as f:
            f.write(source + "\n/* compiler output:\n" + log_text.replace("*/", "* /") + "\n*/\n")
        return path


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def compile_unit(tmp: str, full: str, stripped: str, header: str | None, what: str):
    """``_gcc``, with every failure raised as a one-line CppBuildError naming the kernel(s),
    the cause (the first error, or the signal or timeout) and the dump of the source."""
    try:
        proc, cmd, out = _gcc(tmp, full, stripped, header)
    except CompilerCrash as e:
        dump = dump_failure(what, full, f"{e}\n{getattr(e, 'stderr', '')}")
        raise CompilerCrash(f"[build] {e} building kernel {what}; source in {dump}") from None
    except CppBuildError as e:
        raise CppBuildError(f"[build] {e} (building kernel {what})") from None
    if proc.returncode != 0:
        dump = dump_failure(what, full, f"{' '.join(cmd)}\n{proc.stderr}")
        raise CppBuildError(f"[build] {os.path.basename(cmd[0])} failed (exit {proc.returncode}) building "
                            f"kernel {what}: {_first_error(proc.stderr)}; source and compiler output in {dump}")
    return proc, cmd, out


def _build(source: str, so_path: str, what: str):
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-") as tmp:
        t0 = time.perf_counter()
        header = pch.header_for(source)
        _, _, out = compile_unit(tmp, source, pch.without_prelude(source), header, what)
        with open(out, "rb") as f:
            cache.store(so_path, f.read())
        log.detail("kernels", "built %s in %.0f ms%s", so_path, (time.perf_counter() - t0) * 1e3,
                   " (precompiled prelude)" if header is not None else "")
    counters.bump("kernel_builds")


def clear_memory():
    with _lock:
        _loaded.clear()


def _key(source: str) -> str:
    return cache.content_key(source, config.cpp_compiler, compiler_version(config.cpp_compiler),
                             " ".join(config.cpp_flags), platform.machine())


def _so_path(key: str) -> str:
    return os.path.join(cache.subdir("cpp"), key[:2], key + ".so")


_NAME = re.compile(r'extern "C"[^(]*?\b(\w+)\s*\(')
_mapped: dict = {}  # path -> (st_dev, st_ino) of the file this process dlopened there


def exports(source: str) -> list:
    """The ``extern "C"`` symbols of a kernel's source: what its cache entry must define (the
    key covers the whole source; a batch's object defines more, which is harmless)."""
    return _NAME.findall(source)


def _dlopen(path: str) -> ctypes.CDLL:
    """``ctypes.CDLL(path)`` (called under the entry's shared lock: the file stays put). glibc
    answers a path it has opened before with the library it mapped then, whatever file is there
    now, so a path whose file was replaced since (an entry evicted and rebuilt, or stored again
    by another process) is opened through a hard link of a name of its own, which maps the new
    file."""
    st = os.stat(path)
    ident = (st.st_dev, st.st_ino)
    with _lock:
        seen = _mapped.get(path)
    if seen is None or seen == ident:
        lib = ctypes.CDLL(path)
        with _lock:
            _mapped.setdefault(path, ident)
        return lib
    alias = os.path.join(os.path.dirname(path), f".tmp-load-{os.getpid()}-{threading.get_ident()}-"
                         f"{ident[1]}-{os.path.basename(path)}")
    try:
        try:
            os.link(path, alias)
        except OSError:
            shutil.copyfile(path, alias)
        return ctypes.CDLL(alias)
    finally:
        if os.path.exists(alias):
            os.unlink(alias)


def _missing(lib: ctypes.CDLL, names) -> list:
    out = []
    for n in names:
        try:
            lib[n]  # (a lookup that does not cache the function on the library)
        except AttributeError:
            out.append(n)
    return out


def _open_entry(so_path: str, needed=()):
    """(the loaded library, None) or (None, why it is unusable): the entry verified, mapped and
    checked to define the symbols ``needed``, under the cache's shared lock."""
    with cache.reading(so_path) as ok:
        if not ok:
            return None, None
        try:
            lib = _dlopen(so_path)
        except OSError as e:
            return None, f"its digest matches but it does not load: {str(e).strip()[:200]}"
        missing = _missing(lib, needed)
        if missing:
            return None, f"it lacks the symbol{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        return lib, None


def load_cpp(source: str, name: str | None = None) -> ctypes.CDLL:
    """The shared object for source: from memory, from the disk cache, or built now. An entry
    that verifies but does not load (garbage, empty) or lacks a symbol of the source (another
    kernel's object: a warning names the kernel) is evicted and rebuilt in this call."""
    key = _key(source)
    with _lock:
        lib = _loaded.get(key)
    if lib is not None:
        return lib
    needed = exports(source)
    if name is None:
        name = needed[0] if needed else key[:12]
    so_path = _so_path(key)
    lib, why = _open_entry(so_path, needed)
    if lib is not None:
        counters.bump("disk_cache_hits")
        log.log("cache", "cpp kernel %s from disk", key[:12])
        log.detail("cache", "  %s", so_path)
    else:
        if why is not None:
            if why.startswith("it lacks"):
                warnings.warn(f"kiln: the cached shared object of kernel {name} ({so_path}) {why}; "
                              f"evicting it and building {name} again", RuntimeWarning, stacklevel=2)
            cache.evict(so_path, why)
        so_path = _so_path(key)  # (a refused cache moved the root: the rebuild goes to the private one)
        log.log("cache", "cpp kernel %s not cached: building it", key[:12])
        log.detail("cache", "  -> %s", so_path)
        _build(source, so_path, name)
        lib, why = _open_entry(so_path, needed)
        if lib is None:
            raise CppBuildError(f"[build] kernel {name} was built but does not load from {so_path}: "
                                f"{why or 'the entry vanished'}")
    with _lock:
        lib = _loaded.setdefault(key, lib)
    return lib


def load_cpp_function(source: str, name: str, nargs: int, nsizes: int = 0):
    """``nargs`` pointers, then ``nsizes`` int64 symbolic sizes: a ctypes function, called
    through ``cpp_call``'s extension where it is available."""
    from kiln.runtime import cpp_call
    fn = getattr(load_cpp(source, name), name)
    fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_int64] * nsizes
    fn.restype = None
    return cpp_call.bind(fn, nargs + nsizes)


def load_cpp_checker(source: str, name: str):
    fn = getattr(load_cpp(source, name), f"{name}_check")
    fn.argtypes = []
    fn.restype = ctypes.c_int
    return fn


def load_cpp_threads(source: str, name: str):
    """``<name>_threads()`` of a chunk-tuned kernel: its OpenMP thread count."""
    fn = getattr(load_cpp(source, name), f"{name}_threads")
    fn.argtypes = []
    fn.restype = ctypes.c_int
    return fn


# ---------------------------------------------------------------------- several kernels, one gcc
BATCH_MAX = 16  # kernels per shared object: past this, more batches keep the progress moving


def build_missing(sources: list, workers: int) -> int:
    """Build the kernels among ``sources`` that are neither loaded nor in the disk cache
    several to one shared object, in about ``workers`` gcc runs at once. gcc spends most of a
    small kernel's build starting up and reading the prelude (or its precompiled header), so
    the 8 distinct kernels of a tiny GPT's forward build in 0.26 s as two objects against
    0.44 s as eight, and its backward's 13 in 0.18 s against about 0.7 s. Each kernel is wrapped
    in a namespace of its own (its static helpers stay apart; its ``extern "C"`` entry points
    keep their names); every kernel's cache entry is the whole object, hard-linked, under the
    kernel's own key, so a later process finds each kernel where ``load_cpp`` looks, and
    ``dlopen`` maps the object once (same inode). A batch that fails to build is left to the
    one-kernel path, which reports its error. Returns the number of kernels built."""
    if not config.cpp_batch_builds:
        return 0
    todo: dict = {}
    for src in sources:
        if pch._prelude() not in src:
            continue
        key = _key(src)
        with _lock:
            loaded = key in _loaded
        if loaded or key in todo or os.path.exists(_so_path(key)):
            continue  # (an entry on disk is checked, and rebuilt if corrupt, by load_cpp)
        todo[key] = src
    if len(todo) < 2:
        return 0
    batches = []
    for kind in ("base", "simd"):
        items = [(k, s) for k, s in todo.items() if pch._kind(s) == kind]
        batches += _split(items, workers)
    from kiln.runtime import pool
    built = pool.run_jobs(_build_batch, batches, weights=[len(b) for b in batches])
    return sum(built)


def _split(items: list, workers: int) -> list:
    """Batches of at most BATCH_MAX kernels, at least ``workers`` of them (when there are
    kernels enough), balanced by source length (the longest first into the lightest batch)."""
    if not items:
        return []
    n = min(len(items), max(workers, -(-len(items) // BATCH_MAX)))
    bins: list = [[] for _ in range(n)]
    load = [0] * n
    for item in sorted(items, key=lambda kv: -len(kv[1])):
        i = min(range(n), key=lambda j: (load[j], len(bins[j])))
        bins[i].append(item)
        load[i] += len(item[1])
    return [b for b in bins if b]


def batch_source(sources: list, with_prelude: bool) -> str:
    """One translation unit for several kernels: the prelude (or nothing, when it comes from
    the precompiled header), then each kernel without its prelude in its own namespace."""
    kind = pch._kind(sources[0])
    parts = [pch.pch_source(kind)] if with_prelude else []
    for j, src in enumerate(sources):
        parts.append(f"namespace kiln_unit{j} {{\n{pch.without_prelude(src)}\n}}  // kiln_unit{j}\n")
    return "".join(parts)


def _build_batch(batch: list) -> int:
    """Build one batch; 0 when it does not compile (each kernel then builds alone and reports
    its own error). A compiler that hangs or is killed is not tried once per kernel after it:
    CompilerCrash propagates."""
    keys = [k for k, _ in batch]
    sources = [s for _, s in batch]
    t0 = time.perf_counter()
    names = [(_NAME.search(s).group(1) if _NAME.search(s) else k[:12]) for k, s in batch]
    what = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "") + \
        (f" (a batch of {len(names)})" if len(names) > 1 else "")
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-batch-") as tmp:
        header = pch.header_for(sources[0])
        try:
            _, _, out = compile_unit(tmp, batch_source(sources, with_prelude=True),
                                     batch_source(sources, with_prelude=False), header, what)
        except CompilerCrash:
            raise
        except CppBuildError as e:
            log.log("kernels", "a batch of %d C++ kernels did not build; building them one by one: %s",
                    len(batch), e)
            return 0
        with open(out, "rb") as f:
            cache.store_many([_so_path(k) for k in keys], f.read())
    # each kernel's function from the batch's object where its first entry still holds it;
    # one that another process replaced meanwhile (its own object of that one kernel) leaves
    # the others to load_cpp, from their own entries
    lib, _ = _open_entry(_so_path(keys[0]))
    with _lock:
        for key, src in batch:
            if lib is not None and not _missing(lib, exports(src)):
                _loaded.setdefault(key, lib)
    counters.bump("kernel_builds", len(batch))
    log.detail("kernels", "built %d C++ kernels into one object in %.0f ms%s", len(batch),
               (time.perf_counter() - t0) * 1e3, " (precompiled prelude)" if header is not None else "")
    return len(batch)
