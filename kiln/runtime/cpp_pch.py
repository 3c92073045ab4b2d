"""A precompiled header for the prelude of every generated C++ kernel.

Parsing ``<cmath>``, ``<cstring>``, ``<limits>`` and ``<cstdint>`` is most of gcc's time on a
small kernel (0.14 of 0.15 s here), and ``<immintrin.h>``, which bf16 kernels include on
machines with AVX512-BF16, adds about 0.5 s more. gcc can load those declarations from a
precompiled header instead: a small fp32 kernel then builds in 0.085 s and a bf16 one in
0.16 s instead of 0.63 s.

The header (``pch_source``: the codegen prelude; a second kind adds ``<immintrin.h>`` under the
same guard as the bf16 helper, for the kernels that include it) is compiled once per compiler,
flags and machine into
``<cache>/pch/<key>/kiln_prelude.h.gch``, by a background thread after the first build stage
that ran gcc (never during one: on 2 cores that made the first compile slower), at low
priority, in a temporary directory renamed into place (atomic; the first process to finish
wins), with a digest checked once per process.
A kernel whose source holds the codegen prelude is then built with ``-include <header>`` and
the prelude removed; its binary is the same code, and its cache key is its unchanged source.
If gcc fails with the precompiled header, the header is given up for the process (logged on
``cache``) and the kernel is built from its plain source. ``KILN_CONFIG=cpp_pch=0`` turns this off.
"""
from __future__ import annotations

import atexit
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time

from kiln import log
from kiln.config import config
from kiln.runtime import cache
from kiln.inductor.codegen.cpp import PRELUDE

HEADER = "kiln_prelude.h"
_state: dict = {}  # header directory -> "building" | "failed" | path of the header (ready)
_lock = threading.Lock()
_running: set = set()  # gcc processes building a header now


_tmp_dirs: set = set()  # this process's header builds in progress (``.tmp-<pid>-*``)
_reaped: set = set()    # pch folders swept of dead processes' leftovers this process
STALE_S = 3600.0        # a leftover whose process cannot be asked is removed after this
_stopping = False       # set at exit: a header build that starts after it cleans up at once


@atexit.register
def _stop_builds():
    """A header still building when the process exits is never renamed into place (the
    thread that would do it is gone), so its gcc would only take CPU from whatever runs next
    (on 2 cores, the next process's first call): stop it, and remove its temporary folder
    (about 15 MiB: short processes left one each)."""
    global _stopping
    with _lock:  # a build thread slowed by a loaded host may only now be making its folder
        _stopping = True
        procs = list(_running)
        tmps = list(_tmp_dirs)
    for proc in procs:
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.SubprocessError):
            pass
    for tmp in tmps:
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale(folder: str):
    """Remove the ``.tmp-<pid>-*`` header builds of processes that are gone (killed before
    their exit handler ran), and any older than ``STALE_S``; once per folder per process."""
    if folder in _reaped:
        return
    _reaped.add(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        if not name.startswith(".tmp-"):
            continue
        path = os.path.join(folder, name)
        parts = name.split("-")
        pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        try:
            old = now - os.lstat(path).st_mtime > STALE_S
        except OSError:
            continue
        if pid == os.getpid() or (pid is not None and _alive(pid) and not old):
            continue
        if pid is None and not old:
            continue
        shutil.rmtree(path, ignore_errors=True)


def _prelude() -> str:
    return PRELUDE


_SIMD = ("#if defined(__AVX512BF16__) && defined(__AVX512F__)\n"
         "#include <immintrin.h>\n"
         "#endif\n")
_wanted: set = set()  # header kinds a build asked for this process


def pch_source(kind: str = "base") -> str:
    """The header of a kind: ``base`` (the prelude) or ``simd`` (with ``<immintrin.h>``, for
    kernels that include it: their 0.5 s of parsing; the base one builds in 0.34 s instead of
    1.2 s and loads faster, so the others use it)."""
    return _prelude() + (_SIMD if kind == "simd" else "")


def _kind(source: str) -> str:
    return "simd" if "#include <immintrin.h>" in source else "base"


def _key(kind: str = "base") -> str:
    """The header's directory for the current compiler, flags, machine and cache directory."""
    from kiln.runtime.cpp_build import compiler_version
    key = cache.content_key("cpp-pch", pch_source(kind), config.cpp_compiler,
                            compiler_version(config.cpp_compiler), " ".join(config.cpp_flags),
                            platform.machine())
    folder = cache.subdir("pch")
    reap_stale(folder)
    return os.path.join(folder, key[:32])


def header_for(source: str) -> str | None:
    """The path to ``-include`` for this kernel, or None (build it from its plain source).
    A header already on disk is picked up here; a missing one is built by ``after_builds``."""
    if not config.cpp_pch or _prelude() not in source:
        return None
    kind = _kind(source)
    key = _key(kind)
    with _lock:
        state = _state.get(key)
        _wanted.add(kind)
    if state is None:
        # on disk from an earlier process: its digest is checked once; a corrupt one is
        # removed here and built again by after_builds, never inside a kernel's build
        gch = os.path.join(key, HEADER + ".gch")
        if not os.path.exists(gch) or not cache.valid_entry(gch):
            return None
        with _lock:
            state = _state.setdefault(key, os.path.join(key, HEADER))
    return state if state not in ("building", "failed") else None


def after_builds():
    """After a build stage that ran gcc: build the headers its kernels asked for in the
    background when they are missing, so that they never compete with a compile's own kernel
    builds (on 2 cores that made the first compile 0.4-0.6 s slower), and later builds of this
    process and of later ones use them."""
    if not config.cpp_pch:
        return
    todo = []
    with _lock:
        for kind in sorted(_wanted):  # "base" before "simd"
            key = _key(kind)
            if _state.get(key) is None:
                _state[key] = "building"
                todo.append((key, kind))
    if todo:
        threading.Thread(target=lambda: [_ensure(k, kind) for k, kind in todo], name="kiln-cpp-pch",
                         daemon=True).start()


def without_prelude(source: str) -> str:
    return source.replace(_prelude(), "\n", 1)


def failed(stderr: str):
    """gcc failed with the precompiled header: give it up for this process."""
    with _lock:
        for key, state in list(_state.items()):
            if state not in ("building", "failed"):
                _state[key] = "failed"
    log.log("cache", "a kernel failed to build with the precompiled prelude; building without it "
            "from now on: %s", stderr.strip().splitlines()[-1] if stderr.strip() else "")


def _ensure(key: str, kind: str = "base"):
    try:
        path = _ready_or_build(key, kind)
    except Exception as e:  # noqa: BLE001 - kernels keep parsing the prelude
        log.log("cache", "no precompiled prelude (%s: %s)", type(e).__name__, e)
        path = "failed"
    with _lock:
        if _state.get(key) != "failed" or path == "failed":
            _state[key] = path


def _ready_or_build(final: str, kind: str) -> str:
    header, gch = os.path.join(final, HEADER), os.path.join(final, HEADER + ".gch")
    if os.path.exists(gch) and cache.valid_entry(gch):
        return header
    if os.path.isdir(final):  # a bad entry (valid_entry removed the .gch): build it again
        _remove_dir(final)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=os.path.dirname(final))  # 0700
    with _lock:
        stopping = _stopping
        if not stopping:
            _tmp_dirs.add(tmp)
    if stopping:  # the process is exiting: _stop_builds has already swept its folders
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError("the process is exiting: no header build")
    try:
        from kiln.runtime.cpp_build import write_private
        write_private(os.path.join(tmp, HEADER), pch_source(kind))
        flags = [f for f in config.cpp_flags if f != "-shared"]
        cmd = [config.cpp_compiler, *flags, "-x", "c++-header", os.path.join(tmp, HEADER),
               "-o", os.path.join(tmp, HEADER + ".gch")]
        if shutil.which("nice"):  # kernels being built meanwhile come first
            cmd = ["nice", "-n", "10", *cmd]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                umask=0o077)  # the .gch is this user's from its first byte
        with _lock:
            _running.add(proc)
            if _stopping:
                proc.kill()
        try:
            timeout = config.build_timeout if config.build_timeout and config.build_timeout > 0 else None
            try:
                _, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise RuntimeError(f"{config.cpp_compiler} timed out after {timeout:g} s (killed) "
                                   "precompiling the prelude") from None
        finally:
            with _lock:
                _running.discard(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {stderr.strip()[-500:]}")
        os.chmod(os.path.join(tmp, HEADER + ".gch"), 0o600)  # gcc's output follows the umask
        cache.commit_entry(os.path.join(tmp, HEADER + ".gch"))
        try:
            os.rename(tmp, final)
        except OSError:  # another process put its header there first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        with _lock:
            _tmp_dirs.discard(tmp)
    if not (os.path.exists(gch) and cache.valid_entry(gch)):
        raise RuntimeError(f"{gch} is missing or corrupt after its build")
    log.log("cache", "precompiled the C++ prelude into %s", final)
    return header


def _remove_dir(path: str):
    """Out of the way in one step (a kernel build reading it sees all of it or none), then
    removed."""
    away = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-gone-{os.path.basename(path)}")
    try:
        os.rename(path, away)
        path = away
    except OSError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def wait_ready(timeout: float = 120.0, kind: str = "base") -> str | None:
    """Block until the header of this kind for the current settings is built (tests)."""
    import time
    key = _key(kind)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _lock:
            state = _state.get(key)
        if state is None:
            with _lock:
                _wanted.add(kind)
            after_builds()
        elif state == "failed":
            return None
        elif state != "building":
            return state
        time.sleep(0.01)
    return None


def reset():
    with _lock:
        _state.clear()
        _wanted.clear()
