"""Launching Triton kernels through their compiled launcher.

A wrapper launches a kernel as ``kernel[(grid,)](ptrs..., scalars..., XBLOCK=.., num_warps=..)``,
or, when the grid is static, through a ``LaunchLine`` built once beside the wrapper
(``kiln_kernel3_launch(ptrs..., scalars...)``). ``FastLauncher`` stands in the wrapper's
namespace for the @triton.jit function. Its first call for a grid (``slow``) finds the
``CompiledKernel`` in kiln's binary record (``triton_binary``) or through the JIT (which
compiles, or loads from its disk cache, and launches) and keeps it; later calls call that
kernel's launcher directly with the argument list the JIT would pass (``_Bound``), skipping
the JIT's binding, specialization and cache lookup; a launcher this module recognizes is
entered at its C function (``_direct``).

The compiled kernel is specialized on its arguments: 16-byte alignment of pointers, and for
integers the value 1, divisibility by 16 and the 32-bit range. Each call checks those few facts
(one ``data_ptr()`` per pointer, a comparison per integer); a call that differs, or runs on
another device, takes the slow path, which picks the right binary. Launch hooks (profilers) or
a Triton whose kernel lacks the launcher fields keep the JIT path.
``config.triton_fast_launch`` (``KILN_CONFIG=triton_fast_launch=0``) turns this off.
"""
from __future__ import annotations

from kiln import counters, log
from kiln.runtime import triton_binary
from kiln.config import config
from kiln.inductor.codegen.triton import interpreting


def _int_class(v: int):
    return (v == 1, v % 16 == 0, -2 ** 31 <= v < 2 ** 31)


class _Bound:
    """The compiled kernel of one launch line, with what the per-call checks need. A launch is
    ``run(gx, gy, gz, stream, function, *head, *args, *const_tail)``: ``run`` is the kernel's
    launcher and ``head`` its metadata and (empty) hooks, or, for a launcher this module knows
    (``_direct``), the launcher's own C entry point and what its ``__call__`` would add."""
    __slots__ = ("run", "function", "head", "const_tail", "aligned", "ints", "device", "kwargs", "ptrs")

    def __init__(self, kernel, names, args, kwargs, device):
        n = len(args)
        if any(k not in kwargs for k in names[n:]) or any(k in kwargs for k in names[:n]):
            raise ValueError("constexprs are not the trailing keyword arguments")
        run = kernel.run
        self.function = kernel.function
        packed = kernel.packed_metadata
        direct = _direct(run)
        if direct is not None:
            self.run, self.head = direct[0], direct[1] + (packed, None, None, None)
        else:
            self.run, self.head = run, (packed, None, None, None)
        self.const_tail = tuple(kwargs[k] for k in names[n:])
        # every pointer argument, and whether the binary assumed it aligned
        self.ptrs = tuple((i, a.data_ptr() % 16 == 0) for i, a in enumerate(args) if hasattr(a, "data_ptr"))
        self.aligned = tuple(i for i, aligned in self.ptrs if aligned)
        self.ints = tuple((i, _int_class(a)) for i, a in enumerate(args)
                          if isinstance(a, int) and not isinstance(a, bool))
        self.device = device
        self.kwargs = dict(kwargs)


# sha256 of the normalized source of launcher ``__call__`` methods whose whole work, when the
# kernel needs no global or profile scratch memory, is
# ``self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl,
# None, None, *args)``: Triton 3.6's CUDA launcher. Calling ``launch`` directly skips a Python
# frame and two closure calls per launch. Any other launcher (another Triton) keeps its
# ``__call__``.
KNOWN_LAUNCHERS = {"eb10ba45d05aee896c49f1bfaa1e95467857e839d7b80e91b9bb1ac8d8f3c32c"}
_direct_by_class: dict = {}


def _call_digest(cls) -> str | None:
    import hashlib
    import inspect
    import textwrap
    try:
        src = inspect.getsource(cls.__call__)
    except (OSError, TypeError, AttributeError):
        return None
    norm = "\n".join(line.rstrip() for line in textwrap.dedent(src).strip().splitlines())
    return hashlib.sha256(norm.encode()).hexdigest()


def _direct(run):
    """(launch, (cooperative, pdl, None, None)) for a launcher of a known kind that needs no
    scratch memory, else None. ``KILN_CONFIG=triton_direct_launch=0`` turns it off."""
    if not config.triton_direct_launch:
        return None
    cls = type(run)
    known = _direct_by_class.get(cls)
    if known is None:
        known = _direct_by_class[cls] = _call_digest(cls) in KNOWN_LAUNCHERS
    if not known:
        return None
    try:
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        return run.launch, (run.launch_cooperative_grid, run.launch_pdl, None, None)
    except AttributeError:
        return None


class FastLauncher:
    """``launcher[grid](*args, **kwargs)`` like a JIT function; see the module doc."""
    __slots__ = ("fn", "name", "bound", "failed", "_get_device", "_get_stream", "_hooks")

    def __init__(self, fn, name: str, get_device=None, get_stream=None, hooks=None):
        self.fn, self.name = fn, name
        self.bound: dict = {}  # grid -> _Bound
        self.failed = False
        if get_device is None:
            from triton.runtime import driver  # optional dependency: loaded only for Triton kernels

            from kiln.runtime.builder import wait_triton_driver
            wait_triton_driver()
            get_device = driver.active.get_current_device
            get_stream = driver.active.get_current_stream
            import torch
            if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
                # the same answer without current_device's lazy-init check: the device is only
                # asked after a launch, so CUDA is up (a measurable share of a launch)
                get_device = torch._C._cuda_getDevice
        self._get_device, self._get_stream = get_device, get_stream
        self._hooks = hooks if hooks is not None else _launch_hooks

    def __getitem__(self, grid):
        return _GridLaunch(self, grid)

    def slow(self, grid, args, kwargs):
        """A launch the bound kernels do not cover: the first of this grid, or arguments that
        specialize differently. The kernel comes from kiln's binary record when there is one
        (``triton_binary``), else from Triton's JIT, which launches it too."""
        hooks = self._hooks()
        key = None if self.failed or hooks else self._record_key(args, kwargs)
        if key is not None:
            kernel = triton_binary.load(key, self.fn, self._get_device(), self.name)
            b = None if kernel is None else self._bind(grid, kernel, args, kwargs)
            if b is not None:
                _launch(b, grid, args, self._get_stream)
                return kernel
        kernel = self.fn[grid](*args, **kwargs)
        counters.bump("triton_jit_launches")
        if key is not None:
            triton_binary.save_from_kernel(key, kernel, self.name)
        if not self.failed and not hooks:
            self._bind(grid, kernel, args, kwargs)
        return kernel

    def _record_key(self, args, kwargs):
        if not config.triton_binary_records:
            return None
        try:
            facts = triton_binary.runtime_facts(args)
            if facts is None:
                return None
            inner = getattr(self.fn, "fn", self.fn)
            return triton_binary.record_key(inner.__module__, inner.__name__, facts, kwargs,
                                            triton_binary.arch_of(self._get_device()))
        except Exception as e:  # noqa: BLE001 - no record: the JIT path as before
            log.log("kernels", "%s: no binary record key (%s: %s)", self.name, type(e).__name__, e)
            return None

    def _bind(self, grid, kernel, args, kwargs):
        """The kernel bound to these arguments, kept for the grid's later calls when the grid
        has none yet; None (and the JIT on every call) when this Triton's kernel is not like
        ours."""
        try:
            b = _Bound(kernel, list(self.fn.arg_names), args, kwargs, self._get_device())
        except Exception as e:  # noqa: BLE001
            self.failed = True
            log.log("kernels", "%s: launching through the JIT on every call (%s: %s)", self.name,
                    type(e).__name__, e)
            return None
        if grid not in self.bound and len(self.bound) < 16:
            self.bound[grid] = b
        return b


def _launch(b, grid, args, get_stream):
    n = len(grid)
    b.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, get_stream(b.device), b.function,
          *b.head, *args, *b.const_tail)


class _GridLaunch:
    __slots__ = ("launcher", "grid")

    def __init__(self, launcher, grid):
        self.launcher, self.grid = launcher, grid

    def __call__(self, *args, **kwargs):
        lau = self.launcher
        b = lau.bound.get(self.grid)
        if b is None or kwargs != b.kwargs:
            return lau.slow(self.grid, args, kwargs)
        for i in b.aligned:
            if args[i].data_ptr() & 15:
                return lau.slow(self.grid, args, kwargs)
        for i, cls in b.ints:
            v = args[i]
            if (v == 1, v % 16 == 0, -2 ** 31 <= v < 2 ** 31) != cls:
                return lau.slow(self.grid, args, kwargs)
        device = lau._get_device()
        if device != b.device:
            return lau.slow(self.grid, args, kwargs)
        grid = self.grid
        n = len(grid)
        b.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, lau._get_stream(device), b.function,
              *b.head, *args, *b.const_tail)
        return None


class LaunchLine:
    """One launch line of a wrapper, with its grid and constexprs fixed when the wrapper is
    built: ``kiln_kernel3_launch(ptrs..., scalars...)``. A call checks the bound kernel's facts
    and calls its launcher, with no grid object, keyword dict or keyword comparison per call;
    anything unusual takes the launcher's ``slow`` path, as ``_GridLaunch`` does."""
    __slots__ = ("launcher", "grid", "kwargs", "b", "g0", "g1", "g2", "ints")

    def __init__(self, launcher: FastLauncher, grid: tuple, kwargs: dict):
        self.launcher, self.grid, self.kwargs = launcher, tuple(grid), dict(kwargs)
        n = len(self.grid)
        self.g0, self.g1, self.g2 = self.grid[0], self.grid[1] if n > 1 else 1, self.grid[2] if n > 2 else 1
        self.b = None
        self.ints = False

    def __call__(self, *args):
        b = self.b
        if b is None:
            return self._first(args)
        if self.ints:
            # the launcher takes addresses as integers, and then skips its own data_ptr call
            # and the driver's pointer query per tensor (config.triton_pointer_ints)
            a = list(args)
            for i, aligned in b.ptrs:
                p = a[i].data_ptr()
                if aligned and p & 15:
                    return self.launcher.slow(self.grid, args, self.kwargs)
                a[i] = p
        else:
            a = args
            for i in b.aligned:
                if args[i].data_ptr() & 15:
                    return self.launcher.slow(self.grid, args, self.kwargs)
        for i, cls in b.ints:
            v = args[i]
            if (v == 1, v % 16 == 0, -2 ** 31 <= v < 2 ** 31) != cls:
                return self.launcher.slow(self.grid, args, self.kwargs)
        lau = self.launcher
        device = lau._get_device()
        if device != b.device:
            return lau.slow(self.grid, args, self.kwargs)
        b.run(self.g0, self.g1, self.g2, lau._get_stream(device), b.function, *b.head, *a, *b.const_tail)
        return None

    def _first(self, args):
        lau = self.launcher
        out = lau.slow(self.grid, args, self.kwargs)
        b = lau.bound.get(self.grid)
        if b is not None and b.kwargs == self.kwargs:
            self.ints = config.triton_pointer_ints
            self.b = b
        return out


def _jit_line(fn, grid, kwargs, *args):
    return fn[grid](*args, **kwargs)


def line_of(fn, grid, **kwargs):
    """The wrapper's callable for one launch line of ``fn`` (a ``FastLauncher``, or a JIT
    function when fast launches are off or Triton interprets)."""
    if isinstance(fn, FastLauncher):
        return LaunchLine(fn, grid, kwargs)
    import functools
    return functools.partial(_jit_line, fn, tuple(grid), dict(kwargs))


def _hook_set(hook) -> bool:
    """Whether a launch hook would run: Triton 3.5+ keeps a ``HookChain`` in each knob, present
    (and truthy) even when nothing is registered on it, so its list of calls decides."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


def _launch_hooks():
    try:
        from triton import knobs  # optional dependency: loaded only for Triton kernels
        hooks = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    except Exception:  # noqa: BLE001 - older Triton: hooks live on CompiledKernel
        try:
            from triton.compiler import CompiledKernel
            hooks = CompiledKernel.launch_enter_hook, CompiledKernel.launch_exit_hook
        except Exception:  # noqa: BLE001
            return ()
    return tuple(h for h in hooks if _hook_set(h))


def wrap(fn, name: str):
    """The wrapper's handle for a loaded @triton.jit function."""
    if not config.triton_fast_launch or interpreting() or not hasattr(fn, "arg_names"):
        return fn
    return FastLauncher(fn, name)
