"""The build pool: kernel builds of one compile run concurrently, with progress on a terminal.

Jobs are dispatched by threads; a job that is a Python-heavy compile (a Triton kernel) runs in
a *worker process* (``build_worker.py``, started once and reused for the process's life; it
imports neither kiln nor torch), while gcc builds are already subprocesses and run from the
dispatching threads. The pool has ``KILN_COMPILE_THREADS`` workers (``config.compile_threads``;
default: the CPU count, capped at 32); 1 means every build runs in-process, one at a time.

Every worker gets the parent's environment, so Triton's cache-key settings and
``TRITON_CACHE_DIR`` (kiln's ``<cache>/triton_bin``) are the same on both sides.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import json
import os
import queue
import subprocess
import sys
import threading

from kiln import log
from kiln.config import config

MAX_WORKERS = 32
_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_worker.py")


class BuildError(RuntimeError):
    pass


def pool_size() -> int:
    n = config.compile_threads
    if n is None or n <= 0:
        n = min(os.cpu_count() or 1, MAX_WORKERS)
    return max(1, int(n))


class Worker:
    """One build_worker.py process; one request at a time."""
    _ids = itertools.count()

    def __init__(self):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)  # workers compile for the real target
        self.proc = subprocess.Popen([sys.executable, _WORKER_SCRIPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     text=True, bufsize=1)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, msg: dict) -> dict:
        msg = dict(msg, id=next(self._ids))
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (OSError, ValueError) as e:
            raise BuildError(f"[build] build worker {self.proc.pid} is gone: {e}") from e
        if not line:
            raise BuildError(f"[build] build worker {self.proc.pid} exited (code {self.proc.poll()})")
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        try:
            self.proc.stdout.close()
        except Exception:  # noqa: BLE001
            pass


class BuildPool:
    def __init__(self, size: int):
        self.size = size
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._all: list[Worker] = []
        self._count = 0  # workers running or being started; never more than size
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="kiln-build")

    def _reserve(self, n: int) -> int:
        with self._lock:
            n = max(0, min(n, self.size - self._count))
            self._count += n
            return n

    def _start(self) -> Worker:
        try:
            w = Worker()
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
                w = self._start()
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

    def in_worker(self, msg: dict) -> dict:
        """Send a request to a worker process; raise BuildError with its message on failure."""
        w = self._checkout()
        try:
            reply = w.request(msg)
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
