"""A kernel build worker: a long-lived process that builds kernels ahead of their first use.

Run as a script (``python build_worker.py``), never imported by kiln: it imports neither kiln
nor torch, so it starts in a fraction of a second. It reads one JSON request per line on stdin
and answers one JSON line on stdout:

    {"id": 3, "kind": "cpp", "source": ..., "so_path": ..., "cmd": [g++, flags...]}
        builds a shared object into the kernel cache (atomic write + digest sidecar)
    {"id": 4, "kind": "triton", "path": kernel.py, "name": ..., "target": ["cuda", 90, 32],
     "args": [["ptr", "float32", 16], ["int", 4096]], "kwargs": {"XBLOCK": 1024, "num_warps": 4}}
        compiles the @triton.jit function ``name`` of ``path`` for the target through Triton's
        own JIT entry point (``warmup``), with a stand-in driver that names the target, so the
        binary lands in Triton's disk cache (TRITON_CACHE_DIR) under exactly the key the
        parent's first launch computes, and its C launcher where Triton builds one per
        signature (``_build_launcher``); no GPU context is created here. With "record": true
        the answer carries kiln's record of the binary (``triton_record.py``)
    {"id": 5, "kind": "ping"}   warms the imports (with "triton": true, Triton's compiler, its
        backend and its cache key too, so the first build pays only its own compile)

The worker keeps torch out: Triton's argument specializer imports it when it can (to recognize
``torch.Tensor``), and importing torch costs a fresh process seconds (most of a first build;
docs/notes/measurements.md), while the stand-in pointers here are not tensors anyway. An import of torch
fails in the worker (``_NoTorch``); a build that fails for want of torch
lifts the block and runs again with it.

Answers: {"id": ..., "ok": true, "seconds": s} or {"id": ..., "ok": false, "error": text}.

With ``--zygote PATH`` the script is instead the workers' common parent, which forks each
worker after importing once (``zygote``); a forked worker speaks the same protocol over a Unix
socket.
"""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback


def _write_atomic(path, data):
    # kiln/runtime/cache.py's store, repeated: workers import neither kiln nor torch
    # (importing kiln would import torch and cost each worker's start a second). The worker
    # runs under umask 077 (main), so the folders and files it makes are this user's only.
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


def _store(path, data):
    """The entry and its digest, under an exclusive flock of the folder (as cache.store)."""
    import fcntl
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _write_atomic(path, data)
        _write_atomic(path + ".sha256", hashlib.sha256(data).hexdigest().encode())
    finally:
        os.close(fd)


def build_cpp(req):
    """Same entry layout as kiln/runtime/cache.py: the file, then its sha256 in path.sha256."""
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-") as tmp:
        src = os.path.join(tmp, "kernel.cpp")
        out = os.path.join(tmp, "kernel.so")
        with open(src, "w") as f:
            f.write(req["source"])
        cmd = list(req["cmd"]) + [src, "-o", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=req.get("timeout"))
        if proc.returncode != 0:
            raise RuntimeError(f"g++ failed ({' '.join(cmd)}):\n{proc.stderr}")
        with open(out, "rb") as f:
            data = f.read()
    _store(req["so_path"], data)


class _Pointer:
    """Stands for a tensor argument: its dtype and the address alignment the launch will have."""

    def __init__(self, dtype, align):
        self.dtype = dtype
        self._ptr = 0 if align >= 16 else 4

    def data_ptr(self):
        return self._ptr


_modules = {}
_driver_set = [None]


def _target_driver(target):
    import triton  # optional dependency: loaded only for Triton kernels
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    key = tuple(target)
    if _driver_set[0] != key:
        tgt = GPUTarget(target[0], target[1], target[2])

        class TargetDriver:  # what the JIT asks of a driver before it compiles
            def get_current_device(self):
                return 0

            def get_current_stream(self, device=None):
                return 0

            def get_current_target(self):
                return tgt

            def is_active(self):
                return True

        driver.set_active(TargetDriver())
        _driver_set[0] = key
    return triton


def _tl_dtype(name):
    import triton.language as tl  # optional dependency: loaded only for Triton kernels
    return tl.int1 if name == "bool" else getattr(tl, name)


class _NoTorch:
    """A meta-path finder that refuses ``torch`` (and its submodules) with an ImportError,
    which Triton's specializer catches; ``sys.modules["torch"] = None`` would not do: the C
    API hands that None back as the module."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"kiln's build worker keeps torch out (import of {name})")
        return None


def _block_torch():
    if os.environ.get("_KILN_WORKER_TORCH", "0") != "1" and "torch" not in sys.modules:
        sys.meta_path.insert(0, _NoTorch)


def _torch_blocked() -> bool:
    return _NoTorch in sys.meta_path


def _unblock_torch():
    if _NoTorch in sys.meta_path:
        sys.meta_path.remove(_NoTorch)


def warm_triton():
    """Import what every compile needs, and compute Triton's own cache key (a hash of its
    sources and libraries, computed once per process)."""
    import triton  # noqa: F401
    import triton.compiler  # noqa: F401
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
        from triton.backends.nvidia import driver  # noqa: F401
    except Exception:  # noqa: BLE001 - another backend; its first build imports it
        pass
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - a Triton without it
        pass


def build_triton(req):
    try:
        return _build_triton(req)
    except Exception as e:
        if not _torch_blocked() or not (isinstance(e, ImportError) or "torch" in str(e)):
            raise
        _unblock_torch()  # this Triton needs torch here after all
        return _build_triton(req)


_record_module = []


def describe_kernel(kernel):
    """(record, None) or (None, why): kiln's record of the binary (``triton_record.py``, loaded
    by its path: the worker imports no kiln), which the parent keeps so that its first launch
    loads the binary without Triton's JIT."""
    try:
        if not _record_module:
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_record.py")
            spec = importlib.util.spec_from_file_location("kiln_worker_triton_record", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _record_module.append(mod)
        return _record_module[0].describe(kernel), None
    except Exception as e:  # noqa: BLE001 - the parent's first launch goes through the JIT
        return None, f"{type(e).__name__}: {e}"


def _build_triton(req):
    _target_driver(req["target"])
    path = req["path"]
    module = _modules.get(path)
    if module is None:
        spec = importlib.util.spec_from_file_location(req.get("module") or f"kiln_aot_{len(_modules)}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _modules[path] = module
    fn = getattr(module, req["name"])
    args = [_Pointer(_tl_dtype(a[1]), a[2]) if a[0] == "ptr" else a[1] for a in req["args"]]
    _early_launchers()
    try:
        kernel = fn.warmup(*args, grid=(1,), **req["kwargs"])
    finally:
        early = _early.pop("thread", None)
    t0 = time.perf_counter()
    if early is not None:
        early.join()  # its launcher, when it is this kernel's, is in Triton's cache now
    _build_launcher(kernel)
    _last_launcher_s[0] = time.perf_counter() - t0
    return kernel


_last_launcher_s = [0.0]  # the last Triton build's launcher wait, for its answer
_early: dict = {}


def _early_launchers():
    """Build each kernel's C launcher while the kernel itself compiles, not after it (Tritons
    with per-signature launchers spend about a third of a build in gcc on it). The launcher's source follows from the kernel's signature and constants, which are
    known when Triton's JIT calls ``triton.compiler.compile``: a wrapper there starts a thread
    that builds ``CudaLauncher(src, stand-in metadata)``; gcc runs as a subprocess beside the
    compile. Triton caches a launcher under a digest of its C source, so the real launcher
    after the compile (``_build_launcher``) finds this one when the stand-in metadata gave the
    same source, and builds its own when not: a guess costs time, never a wrong launcher."""
    if _early.get("installed") or os.environ.get("_KILN_AOT_LAUNCHERS", "1") == "0":
        return
    _early["installed"] = True
    try:
        import triton.compiler as tc  # optional dependency: loaded only for Triton kernels
        from triton.backends.nvidia import driver as nvidia
    except Exception:  # noqa: BLE001 - another backend
        return
    if not hasattr(nvidia, "make_launcher") or not callable(getattr(tc, "compile", None)):
        return
    import threading
    real_compile = tc.compile

    def compile_with_launcher(src, *args, **kwargs):
        if hasattr(src, "signature") and hasattr(src, "fn") and "thread" not in _early:
            t = threading.Thread(target=_launcher_for, args=(nvidia, src), daemon=True)
            _early["thread"] = t
            t.start()
        return real_compile(src, *args, **kwargs)
    tc.compile = compile_with_launcher


class _StandInMetadata:
    """The compiled kernel's metadata as a launcher reads it, before there is any: no tensor
    descriptors, one CTA, no scratch, no cooperative or PDL launch."""
    tensordesc_meta = None
    num_ctas = 1

    def __getattr__(self, name):
        return 0


def _launcher_for(nvidia, src):
    try:
        nvidia.CudaLauncher(src, _StandInMetadata())
    except Exception:  # noqa: BLE001 - the launcher after the compile builds what it needs
        pass


def _build_launcher(kernel):
    """Put the kernel's C launcher in Triton's cache too. Tritons that generate a launcher per
    signature (3.6) build it with gcc at the first launch, in the parent, one after another (a
    large share of a cold training step: docs/notes/measurements.md). Built here, the parent's first
    launch finds it. Best effort: a Triton without per-signature launchers, or one whose
    launcher wants a live driver, leaves it to the first launch."""
    if kernel is None or os.environ.get("_KILN_AOT_LAUNCHERS", "1") == "0":  # config.aot_launchers
        return
    try:
        from triton.backends.nvidia import driver as nvidia
        if not hasattr(nvidia, "make_launcher"):
            return
        nvidia.CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - the first launch builds it as before
        pass


def _lower_priority():
    """Run this worker (and the compilers it starts) ``config.worker_nice`` (default 10) steps
    nicer than the compiling process, whose own Python stages (lowering and codegen while the
    workers start, the backward's while the forward's kernels build) are on the compile's
    critical path; 0 keeps the parent's priority (measured: docs/notes/measurements.md)."""
    try:
        n = int(os.environ.get("_KILN_WORKER_NICE", "10"))  # set by pool._worker_env
        if n > 0:
            os.nice(n)
    except (ValueError, OSError):
        pass


def serve(rfile, wfile):
    """Answer requests, one JSON line each, until ``rfile`` ends."""
    for line in rfile:
        if not line.strip():
            continue
        req = json.loads(line)
        t0 = time.perf_counter()
        try:
            kind = req["kind"]
            if kind == "cpp":
                build_cpp(req)
            elif kind == "triton":
                kernel = build_triton(req)
            elif kind == "ping":
                if req.get("triton"):
                    warm_triton()
            else:
                raise ValueError(f"unknown request kind {kind!r}")
            reply = {"id": req.get("id"), "ok": True, "seconds": time.perf_counter() - t0}
            if kind == "ping":
                reply["torch_loaded"] = sys.modules.get("torch") is not None
            elif kind == "triton":
                reply["launcher_seconds"] = _last_launcher_s[0]
                if req.get("record"):
                    reply["record"], reply["record_error"] = describe_kernel(kernel)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
            reply = {"id": req.get("id"), "ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        wfile.write(json.dumps(reply) + "\n")
        wfile.flush()


def main():
    os.umask(0o077)  # Triton's cache files and kiln entries written here: this user's only
    _lower_priority()
    _block_torch()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nothing else may write to the protocol
    serve(sys.stdin, out)


def zygote(sock_path):
    """``--zygote PATH``: the workers' common parent. It imports once what every worker needs
    (Triton's compiler, when a fork request asks for it) and then forks a worker per request
    line on stdin (``{"token": t, "triton": bool}``); each child connects to the parent's Unix
    socket at ``sock_path``, says ``{"token": t, "pid": p}`` and serves requests there. Sixteen
    workers then cost one import instead of sixteen at once, each competing with the parent
    while it lowers and generates code. Single-threaded, so forking is safe."""
    import signal
    import socket
    os.umask(0o077)  # inherited by every forked worker
    _lower_priority()
    _block_torch()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished workers
    warmed = False
    while True:
        line = sys.stdin.readline()
        if not line:
            return  # the parent closed the pipe (or exited)
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("triton") and not warmed:
            try:
                warm_triton()
            except Exception:  # noqa: BLE001 - each worker's own first build reports it
                pass
            warmed = True
        if os.fork() != 0:
            continue
        code = 0
        try:  # the worker
            os.setsid()  # its own group: a timeout kills it with the compilers it runs
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its compilers' exit codes are waited for
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(sock_path)
            rfile = conn.makefile("r", encoding="utf-8")
            wfile = conn.makefile("w", encoding="utf-8")
            wfile.write(json.dumps({"token": req.get("token"), "pid": os.getpid()}) + "\n")
            wfile.flush()
            serve(rfile, wfile)
        except BaseException:  # noqa: BLE001 - the parent sees the connection close
            code = 1
        finally:
            os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--zygote":
        zygote(sys.argv[2])
    else:
        main()
