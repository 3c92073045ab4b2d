"""The build pool: kernel builds of one compile run concurrently, with progress on a terminal.

Jobs are dispatched by threads; a job that is a Python-heavy compile (a Triton kernel) runs in
a *worker process* (``build_worker.py``, started once and reused for the process's life; it
imports neither kiln nor torch), while gcc builds are already subprocesses and run from the
dispatching threads. The pool has ``KILN_COMPILE_THREADS`` workers (``config.compile_threads``;
default: the CPU count, capped at 32); 1 means every build runs in-process, one at a time.

Every worker gets the parent's environment, so Triton's cache-key settings and
``TRITON_CACHE_DIR`` (kiln's ``<cache>/triton_bin``) are the same on both sides.

On Linux, with ``config.worker_fork`` (``KILN_CONFIG=worker_fork=1``; off by default until the whole
suite has run with it on a GPU host), workers are forked by
one *zygote* process (``build_worker.py --zygote``) that imports Triton once, instead of each
importing it, and talk over a private Unix socket; should the zygote fail, workers start as
processes of their own again. Sixteen imports then no longer compete with the parent's lowering,
and workers started early import Triton beside capture (measured: docs/notes/measurements.md).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from kiln import log
from kiln.config import config

MAX_WORKERS = 32
_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_worker.py")


class BuildError(RuntimeError):
    pass


class BuildTimeout(BuildError):
    """A build worker ran past ``config.build_timeout`` on a request and was killed."""


def build_timeout() -> float | None:
    t = config.build_timeout
    return float(t) if t and t > 0 else None


def _kill_group(pid: int):
    """SIGKILL a worker and the compilers it started (a worker leads its own session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pool_size() -> int:
    n = config.compile_threads
    if n is None or n <= 0:
        n = min(os.cpu_count() or 1, MAX_WORKERS)
    return max(1, int(n))


def _worker_env() -> dict:
    """The parent's environment, plus the worker settings of ``config`` as private variables:
    a worker imports no kiln (build_worker.py reads them), and a ``config.patch`` in the parent
    holds for the workers it starts."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # workers compile for the real target
    env["_KILN_WORKER_NICE"] = str(int(config.worker_nice))
    env["_KILN_WORKER_TORCH"] = "1" if config.worker_torch else "0"
    env["_KILN_AOT_LAUNCHERS"] = "1" if config.aot_launchers else "0"
    return env


def _end(proc):
    """A worker or zygote reads the end of its input and exits; one that does not is killed."""
    try:
        proc.stdin.close()
        proc.wait(timeout=5)
    except Exception:  # noqa: BLE001
        proc.kill()


class Worker:
    """One build_worker.py process; one request at a time, one JSON line each way."""
    _ids = itertools.count()

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, _WORKER_SCRIPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_worker_env(),
                                     text=True, bufsize=1, start_new_session=True)
        self._out, self._in = self.proc.stdin, self.proc.stdout

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, msg: dict, timeout: float | None = None) -> dict:
        """One request and its answer; past ``timeout`` seconds the worker (and any compiler
        it runs) is killed and BuildTimeout raised."""
        msg = dict(msg, id=next(self._ids))
        fired = []
        timer = None
        if timeout:
            def kill():
                fired.append(True)
                _kill_group(self.proc.pid)
            timer = threading.Timer(timeout, kill)
            timer.daemon = True
            timer.start()
        try:
            self._out.write(json.dumps(msg) + "\n")
            self._out.flush()
            line = self._in.readline()
        except (OSError, ValueError) as e:
            if fired:
                line = ""
            else:
                raise BuildError(f"[build] build worker {self.proc.pid} is gone: {e}") from e
        finally:
            if timer is not None:
                timer.cancel()
        if fired:
            what = msg.get("name") or msg.get("kind")
            raise BuildTimeout(f"[build] build worker {self.proc.pid} timed out after {timeout:g} s building "
                               f"kernel {what} (killed)")
        if not line:
            raise BuildError(f"[build] build worker {self.proc.pid} exited (code {self.proc.poll()})")
        return json.loads(line)

    def close(self):
        _end(self.proc)
        try:
            self.proc.stdout.close()
        except Exception:  # noqa: BLE001
            pass


class _ForkedProc:
    """The parts of Popen a pool uses, for a worker the zygote forked (not this process's child:
    the zygote reaps it)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -1
        except PermissionError:  # the pid was reused by another user's process
            return -1
        return None

    def kill(self):
        _kill_group(self.pid)

    def wait(self, timeout: float = 5.0):
        end = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < end:
            time.sleep(0.005)
        return self.poll()


class ForkedWorker(Worker):
    """A worker forked by the zygote; the same protocol over a Unix socket."""

    def __init__(self, conn, pid: int, rfile, wfile):
        self.conn, self.proc = conn, _ForkedProc(pid)
        self._out, self._in = wfile, rfile

    def close(self):
        for f in (self._out, self._in, self.conn):
            try:
                f.close()  # the worker reads the end of its requests and exits
            except Exception:  # noqa: BLE001
                pass


class Zygote:
    """build_worker.py --zygote: imports once, forks workers on request (see its ``zygote``).
    ``fork`` hands back a ForkedWorker connected through a private Unix socket."""
    FORK_TIMEOUT = 60.0  # seconds: the first fork waits for the zygote's imports

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kiln-zygote-")  # mode 0700: only this user connects
        path = os.path.join(self.dir, "s")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(path)
            self.listener.listen(MAX_WORKERS)
            self.listener.settimeout(self.FORK_TIMEOUT)
            self.proc = subprocess.Popen([sys.executable, _WORKER_SCRIPT, "--zygote", path], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_worker_env(),
                                         text=True, bufsize=1)
        except BaseException:
            self.listener.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self._lock = threading.Lock()
        self._tokens = itertools.count()

    def fork(self, triton: bool) -> ForkedWorker:
        with self._lock:
            if self.proc.poll() is not None:
                raise BuildError(f"[build] the build workers' zygote exited (code {self.proc.poll()})")
            token = next(self._tokens)
            try:
                self.proc.stdin.write(json.dumps({"token": token, "triton": triton}) + "\n")
                self.proc.stdin.flush()
                conn, _ = self.listener.accept()
            except (OSError, ValueError) as e:  # socket.timeout is an OSError
                raise BuildError(f"[build] the build workers' zygote did not fork a worker: {e}") from e
            conn.settimeout(None)
            rfile, wfile = conn.makefile("r", encoding="utf-8"), conn.makefile("w", encoding="utf-8")
            hello = json.loads(rfile.readline() or "{}")
            if hello.get("token") != token:
                conn.close()
                raise BuildError(f"[build] a forked build worker answered {hello!r} for fork {token}")
            return ForkedWorker(conn, hello["pid"], rfile, wfile)

    def close(self):
        _end(self.proc)
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _fork_workers() -> bool:
    return bool(config.worker_fork) and hasattr(os, "fork") and hasattr(socket, "AF_UNIX") \
        and sys.platform.startswith("linux")


class BuildPool:
    def __init__(self, size: int):
        self.size = size
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._all: list[Worker] = []
        self._count = 0  # workers running or being started; never more than size
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="kiln-build")
        self._zygote: Zygote | None = None
        self._zygote_failed = not _fork_workers()
        self._zygote_lock = threading.Lock()

    def _reserve(self, n: int) -> int:
        with self._lock:
            n = max(0, min(n, self.size - self._count))
            self._count += n
            return n

    def _new_worker(self, triton: bool) -> Worker:
        """Forked by the zygote (``config.worker_fork``), else a process of its own."""
        if not self._zygote_failed:
            try:
                with self._zygote_lock:
                    if self._zygote is None:
                        self._zygote = Zygote()
                    zygote = self._zygote
                return zygote.fork(triton)
            except Exception as e:  # noqa: BLE001 - workers start as processes of their own
                self._zygote_failed = True
                log.log("kernels", "build workers start on their own: the zygote failed (%s: %s)", type(e).__name__, e)
        return Worker()

    def _start(self, triton: bool = False) -> Worker:
        try:
            w = self._new_worker(triton)
        except BaseException:
            with self._lock:
                self._count -= 1
            raise
        with self._lock:
            self._all.append(w)
        return w

    def _drop(self, w: Worker):
        w.close()
        with self._lock:
            if w in self._all:
                self._all.remove(w)
                self._count -= 1

    def _checkout(self) -> Worker:
        """An idle worker; a new one while the pool has fewer than ``size``; else the next
        worker to come free (a prestarted one still importing, or one finishing a build)."""
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                if self._reserve(1):
                    return self._start()
                try:
                    w = self._idle.get(timeout=0.5)
                except queue.Empty:
                    continue
            if w.alive():
                return w
            self._drop(w)

    def prestart(self, triton: bool = False, count: int | None = None):
        """Start every worker (or up to ``count`` of them) now, each from its own thread, and
        warm its imports (Triton's compiler with ``triton``) while the compile goes on."""
        def start_one():
            try:
                w = self._start(triton)
            except Exception as e:  # noqa: BLE001 - a build starts its own worker later
                log.log("kernels", "build worker did not start: %s", e)
                return
            try:
                w.request({"kind": "ping", "triton": triton})
            except BuildError:
                self._drop(w)
                return
            self._idle.put(w)
        for _ in range(self._reserve(self.size if count is None else count)):
            threading.Thread(target=start_one, name="kiln-build-start", daemon=True).start()

    def in_worker(self, msg: dict, timeout: float | None = None) -> dict:
        """Send a request to a worker process; raise BuildError with its message on failure
        (BuildTimeout past ``timeout`` seconds: the worker is killed and replaced later)."""
        w = self._checkout()
        try:
            reply = w.request(msg, timeout)
        except BuildError:
            self._drop(w)
            raise
        self._idle.put(w)
        if not reply.get("ok"):
            raise BuildError(reply.get("error", "unknown error"))
        return reply

    def map(self, fn, items, label="kernels built", weights=None):
        """fn over items, concurrently; results in order. The first failure is raised once
        every job is done. ``weights``: how many of the progress line's units each item is
        (a batch of kernels)."""
        items = list(items)
        weights = list(weights) if weights is not None else [1] * len(items)
        progress = Progress(sum(weights), label)
        futures = [self._threads.submit(fn, it) for it in items]
        weight_of = dict(zip(futures, weights))
        try:
            for f in concurrent.futures.as_completed(futures):
                progress.step(weight_of[f])
        finally:
            progress.done()
        return [f.result() for f in futures]

    def shutdown(self):
        self._threads.shutdown(wait=False)
        with self._lock:
            workers, self._all = list(self._all), []
            self._count = 0
        for w in workers:
            w.close()
        with self._zygote_lock:
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()


_pool: BuildPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> BuildPool | None:
    """The process's pool, or None when builds run in-process (pool size 1)."""
    global _pool
    size = pool_size()
    if size <= 1:
        return None
    with _pool_lock:
        if _pool is None or _pool.size != size:
            if _pool is not None:
                _pool.shutdown()
            _pool = BuildPool(size)
            log.log("kernels", "build pool of %d workers", size)
        return _pool


@atexit.register
def _shutdown():
    if _pool is not None:
        _pool.shutdown()


def run_jobs(fn, items, label="kernels built", weights=None):
    """fn over items: through the pool when there is one, else in order, in-process."""
    items = list(items)
    weights = list(weights) if weights is not None else [1] * len(items)
    pool = get_pool() if len(items) > 1 else None
    if pool is not None:
        return pool.map(fn, items, label, weights)
    progress = Progress(sum(weights), label)
    try:
        out = []
        for it, w in zip(items, weights):
            out.append(fn(it))
            progress.step(w)
        return out
    finally:
        progress.done()


# ---------------------------------------------------------------------- progress
class Progress:
    """``kiln: kernels built k/n`` on stderr, rewritten in place, only when stderr is a
    terminal and the compile has at least ``config.progress_min`` jobs."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.k = total, label, 0
        stream = sys.stderr
        self.on = (total >= config.progress_min and hasattr(stream, "isatty") and stream.isatty())
        self._lock = threading.Lock()
        if self.on:
            self._show()

    def _show(self):
        sys.stderr.write(f"\rkiln: {self.label} {self.k}/{self.total}")
        sys.stderr.flush()

    def step(self, n: int = 1):
        with self._lock:
            self.k += n
            if self.on:
                self._show()

    def done(self):
        if self.on:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.on = False
