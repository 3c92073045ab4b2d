"""Calling generated C++ kernels without ctypes.

A ctypes call converts each argument through its declared type in Python-level machinery:
about 0.6 us for a kernel of five pointers, most of a small CPU kernel's call. Every generated
kernel takes only pointers and int64 sizes (``void k(const float*, ..., int64_t, ...)``), all of
which travel in integer registers and 8-byte stack slots on x86-64 and AArch64, so one small
Python extension can call any of them: ``kiln_call(address, arity, *ints)`` checks the count
(a mismatch raises TypeError, as ctypes would, instead of calling with the wrong arity), reads
the integers with the C API and calls the address as ``void (*)(int64_t, ...)`` of that arity
(up to ``MAX``), releasing the GIL around the call as ctypes does. The wrapper then holds
``functools.partial(kiln_call, address, arity)``: no Python frame per call.

The extension is built once per Python, compiler and machine into ``<cache>/cpp_call`` (a
digest-checked entry, like kernels). Without Python's headers, on another architecture, or if
the build fails, kernels keep their ctypes functions (logged on ``cache``).
``KILN_CONFIG=cpp_call=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading

from kiln import log
from kiln.config import config
from kiln.runtime import cache

MAX = 64
_ARCHES = ("x86_64", "amd64", "aarch64", "arm64")
_state: dict = {}
_lock = threading.Lock()
_load_lock = threading.Lock()  # one thread loads (or builds) the extension at a time


def c_source() -> str:
    cases = []
    for n in range(MAX + 1):
        params = ", ".join(["I"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: ((void (*)({params}))fn)({args}); break;")
    return "\n".join([
        "#define PY_SSIZE_T_CLEAN",
        "#include <Python.h>",
        "#include <stdint.h>",
        "typedef int64_t I;",
        "static PyObject* kiln_call(PyObject* self, PyObject* const* args, Py_ssize_t n) {",
        "  if (n < 2) {",
        '    PyErr_SetString(PyExc_TypeError, "kiln_call(address, arity, *ints): too few arguments");',
        "    return NULL;",
        "  }",
        "  void* fn = PyLong_AsVoidPtr(args[0]);",
        "  if (fn == NULL) {",
        '    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "kiln_call: null address");',
        "    return NULL;",
        "  }",
        "  Py_ssize_t k = n - 2;",
        "  long arity = PyLong_AsLong(args[1]);",
        "  if (arity == -1 && PyErr_Occurred()) return NULL;",
        "  if (arity != k || k > %d) {" % MAX,
        '    PyErr_Format(PyExc_TypeError, "kiln_call: the kernel takes %ld arguments, %zd given", arity, k);',
        "    return NULL;",
        "  }",
        "  I a[%d + 1];" % MAX,
        "  for (Py_ssize_t i = 0; i < k; ++i) {",
        "    a[i] = (I)PyLong_AsLongLong(args[i + 2]);",
        "    if (a[i] == -1 && PyErr_Occurred()) return NULL;",
        "  }",
        "  Py_BEGIN_ALLOW_THREADS",
        "  switch (k) {",
        *cases,
        "  }",
        "  Py_END_ALLOW_THREADS",
        "  Py_RETURN_NONE;",
        "}",
        "static PyMethodDef methods[] = {",
        '  {"kiln_call", (PyCFunction)(void (*)(void))kiln_call, METH_FASTCALL, "call a kernel address"},',
        "  {NULL, NULL, 0, NULL}};",
        "static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, \"kiln_cpp_call\", NULL, -1, methods};",
        "PyMODINIT_FUNC PyInit_kiln_cpp_call(void) { return PyModule_Create(&module); }",
        "",
    ])


def _why_not() -> str | None:
    if not config.cpp_call:
        return "KILN_CONFIG=cpp_call=0"
    if platform.machine().lower() not in _ARCHES:
        return f"not tested on {platform.machine()}"
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return "Python's headers (Python.h) are not installed"
    return None


def caller():
    """``kiln_call`` from the built extension, or None (kernels keep ctypes). The build
    stage's threads ask at once: one of them loads (or builds) it, the others wait for it."""
    root = cache.cache_root()
    with _lock:
        if root in _state:
            return _state[root]
    with _load_lock:
        with _lock:
            if root in _state:
                return _state[root]
        fn = None
        why = _why_not()
        if why is None:
            try:
                fn = _load()
            except Exception as e:  # noqa: BLE001 - ctypes works everywhere
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        if fn is None:
            log.log("cache", "C++ kernels are called through ctypes: %s", why)
        with _lock:
            _state[root] = fn
    return fn


def _load():
    from kiln.runtime.cpp_build import compiler_version
    source = c_source()
    # (not sysconfig's EXT_SUFFIX: its lazy first read is not thread-safe, and a thread that
    # raced another saw None, built a second copy under another key and paid 0.23 s for it)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = cache.content_key("cpp-call", source, sys.version, config.cpp_compiler,
                            compiler_version(config.cpp_compiler), platform.machine(), suffix)
    path = os.path.join(cache.subdir("cpp_call"), key[:2], key[:32], "kiln_cpp_call" + suffix)
    if not cache.valid_entry(path):
        path = os.path.join(cache.subdir("cpp_call"), key[:2], key[:32], "kiln_cpp_call" + suffix)
        include = sysconfig.get_paths()["include"]
        with tempfile.TemporaryDirectory(prefix="kiln-call-") as tmp:
            src, out = os.path.join(tmp, "kiln_cpp_call.c"), os.path.join(tmp, "kiln_cpp_call" + suffix)
            with open(src, "w") as f:
                f.write(source)
            cc = os.environ.get("CC") or shutil.which("gcc") or config.cpp_compiler
            cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", src, "-o", out]
            from kiln.runtime.cpp_build import run_compiler
            proc = run_compiler(cmd)  # bounded by config.build_timeout
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()[-400:]}")
            with open(out, "rb") as f:
                cache.store(path, f.read())
    loader = importlib.machinery.ExtensionFileLoader("kiln_cpp_call", path)
    spec = importlib.util.spec_from_file_location("kiln_cpp_call", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    try:
        with cache.reading(path) as ok:
            if not ok:
                raise RuntimeError(f"{path} vanished before its load")
            loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - verified but does not load: rebuilt next process
        cache.evict(path, f"it does not load: {e}")
        raise
    return module.kiln_call


def bind(fn, nargs: int):
    """The fastest callable for ctypes function ``fn`` of ``nargs`` integer arguments."""
    call = caller() if nargs <= MAX else None
    if call is None:
        return fn
    bound = functools.partial(call, ctypes.cast(fn, ctypes.c_void_p).value, nargs)
    bound.ctypes_fn = fn  # keeps the library loaded for as long as the wrapper holds the kernel
    return bound


def reset():
    with _lock:
        _state.clear()
