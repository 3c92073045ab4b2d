"""The wrapper: Python source that allocates buffers, launches kernels, calls library ops and
frees each buffer after its last use. Everything decidable at compile time is decided here, so
a call does no more than the printed lines say."""
from __future__ import annotations

import math

import sympy
import torch

from kiln.config import config
from kiln.meta.symbolic import has_symbols, py, py_tuple
from kiln.meta.tensor_meta import contiguous_strides
from kiln.inductor import ir
from kiln.inductor.scheduler import Kernel, ScatterStep, Schedule


class WrapperSource:
    __slots__ = ("source", "kernels", "externs", "size_args")

    def __init__(self, source, kernels, externs, size_args=()):
        self.source, self.kernels, self.externs = source, kernels, externs
        # symbolic sizes no input's size or stride gives: call() takes them after the inputs
        self.size_args = list(size_args)

    def __str__(self):
        return self.source


def _ref_expr(ref: ir.TensorRef, buffers: dict, actual: dict | None = None) -> str:
    """The text of a tensor reference: the buffer's name where the tensor bound to that name
    already has the reference's layout (``actual``: the layout of a name bound to a recycled
    buffer's tensor, see generate_wrapper), else a view of it."""
    buf = buffers[ref.buffer]
    shape, stride = (actual or {}).get(ref.buffer) or (tuple(buf.shape), tuple(buf.stride))
    if tuple(ref.shape) == shape and tuple(ref.stride) == stride and ref.offset == 0:
        return ref.buffer
    offset = f"{ref.buffer}.storage_offset() + {py(ref.offset)}" if ref.offset else f"{ref.buffer}.storage_offset()"
    return f"as_strided({ref.buffer}, {py_tuple(ref.shape)}, {py_tuple(ref.stride)}, {offset})"


def _value_text(v, buffers=None, actual=None) -> str:
    """A Python value as wrapper source; symbolic sizes print as expressions over s0, s1 ...,
    tensors (also inside tuples and lists, e.g. index_put's indices) as buffer expressions."""
    if isinstance(v, ir.TensorRef):
        return _ref_expr(v, buffers, actual)
    if isinstance(v, sympy.Basic):
        return py(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, tuple) and any(isinstance(x, (sympy.Basic, ir.TensorRef, tuple, list)) for x in v):
        items = ", ".join(_value_text(x, buffers, actual) for x in v)
        return f"({items},)" if len(v) == 1 else f"({items})"
    if isinstance(v, list) and any(isinstance(x, (sympy.Basic, ir.TensorRef, tuple, list)) for x in v):
        return f"[{', '.join(_value_text(x, buffers, actual) for x in v)}]"
    return repr(v)


def _device_name(device: torch.device) -> str:
    return f"dev_{device.type}{'' if device.index is None else device.index}"




def ensure_layout(t, shape, stride):
    """t itself when it has the promised strides (the common case: one comparison), else a copy
    with them."""
    if t.stride() == stride or t.numel() <= 1:
        return t
    if all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride)):
        # the same memory order, strides differing only on size-1 dims (a convolution's
        # N x C x 1 x 1 result): a view with the promised strides, not a copy
        return t.as_strided(shape, stride)
    out = t.new_empty_strided(shape, stride)
    out.copy_(t)
    return out


def kernel_error(code: int, kernel: str, reads: str) -> Exception:
    """The exception for the error bits a C++ kernel's ``_check()`` returned
    (codegen/cpp.py INDEX_ERROR, ZERO_DIVISION), as eager raises it: an integer division or
    remainder by zero is eager's ``RuntimeError: ZeroDivisionError``."""
    if code & 2:
        return RuntimeError("ZeroDivisionError")
    return IndexError(f"kiln: an index read by {kernel} is out of range for its dimension ({reads})")


def _check_lines(gen, reads: str) -> list[str]:
    """After a checked C++ kernel: raise what its error flags report (each read once)."""
    return [f"    kernel_errors = {gen.name}_check()",
            "    if kernel_errors:",
            f"        raise kernel_error(kernel_errors, {gen.name!r}, {reads!r})"]


def _launch(gen, target, defs: list) -> str:
    if target == "triton":
        return _triton_call(gen, defs)
    if target == "python":  # loop_python's kernels take the tensors themselves
        return f"{gen.name}({', '.join(list(gen.args) + list(gen.sizes))})"
    return f"{gen.name}({', '.join([f'{a}.data_ptr()' for a in gen.args] + list(gen.sizes))})"


def _triton_call(gen, defs: list) -> str:
    """A Triton kernel's launch. A static grid gets a launch line built once, beside the
    wrapper (``runtime/launch.py``'s ``LaunchLine``: the call passes only pointers and
    scalars); a grid computed from the call's sizes, or a tuned kernel, keeps its own form."""
    if getattr(gen, "tune", None) is not None or not isinstance(gen.grid, int):
        return gen.launch_line()
    consts = ", ".join([f"{k}={v}" for k, v in gen.constexprs.items()] + [f"num_warps={gen.num_warps}"])
    defs.append(f"{gen.name}_launch = launch_line({gen.name}, ({gen.grid},), {consts})")
    return f"{gen.name}_launch({', '.join(list(gen.args) + [str(s) for s in gen.scalars])})"


def _dense(shape, stride) -> bool:
    """The strides cover exactly numel elements (a permutation of contiguous strides)."""
    if has_symbols(tuple(shape) + tuple(stride)):  # symbolic: contiguous is dense
        return tuple(stride) == contiguous_strides(shape)
    n = math.prod(shape)
    if n == 0:
        return False
    return 1 + sum((d - 1) * abs(st) for d, st in zip(shape, stride)) == n and min(stride, default=1) >= 0


class _ReusePool:
    """Dead buffers by (element count, dtype, device): a compile-time plan, so a call only
    renames tensors. A buffer is recycled only after the step that last reads it, so a kernel
    never writes memory it still reads."""

    def __init__(self):
        self.free: dict = {}

    @staticmethod
    def _key(b):
        return math.prod(b.shape), b.dtype, str(b.device)

    def give(self, name, b) -> bool:
        if _dense(b.shape, b.stride):
            self.free.setdefault(self._key(b), []).append(name)
            return True
        return False

    def take(self, b):
        if not _dense(b.shape, b.stride):
            return None
        names = self.free.get(self._key(b))
        return names.pop() if names else None


def _in_place_source(step, name, i, sched, buffers, recyclable) -> str | None:
    """A buffer a pointwise kernel reads for the last time, which its store of ``name`` may
    overwrite: same dtype, device and element count, both dense, and read only by the node
    that stores ``name``, at exactly the element it stores (so each element is read before it
    is written, by the same program; a window or a transpose would read elements other
    programs overwrite). ResNet's bn + bn + add + ReLU after a downsampling block wrote a third
    51 MB buffer beside the two convolution outputs it reads (batch 32 bf16), where
    torch.compile writes over one of them."""
    if step.is_reduction or not isinstance(step, Kernel):
        return None
    b = buffers[name]
    if not _dense(b.shape, b.stride):
        return None
    node = next(n for n in step.nodes if n.name == name)
    ranges = ir.ranges_of(step.ranges)
    store = sympy.expand(ir.simplify_index(step.store_index(node), ranges))
    for old in sorted(step.reads() & recyclable):
        o = buffers[old]
        if sched.last_use.get(old) != i or o.dtype != b.dtype or str(o.device) != str(b.device) \
                or math.prod(o.shape) != math.prod(b.shape) or not _dense(o.shape, o.stride):
            continue
        if _reads_only_at(step, node, old, store, ranges):
            return old
    return None


def _reads_only_at(step, node, old, store, ranges) -> bool:
    # the other nodes by their read sets first: remapping every node's body for every candidate
    # was a quarter of GPT-2's compile (613 checks over 160 stores)
    if any(n is not node and old in n.reads() for n in step.nodes):
        return False
    loads = [ld for ld in ir.loads_of(step.body(node)) if ld.buffer == old]
    return all(sympy.expand(ir.simplify_index(ld.index, ranges)) == store for ld in loads)


def _check_bound(step, gen, bound: set) -> None:
    """A kernel argument no earlier step produced would be a NameError at call time, far from
    its cause; it is a compile error instead (the graph then runs eagerly, with a warning)."""
    stores = set(step.stores)
    for a in getattr(gen, "args", ()):
        if isinstance(a, str) and a.isidentifier() and a not in bound and a not in stores:
            raise ValueError(f"[codegen:wrapper] {step.name} reads {a}, which no earlier step "
                             f"stores (a value computed inside the kernel, read off its store index?)")


def generate_wrapper(sched: Schedule, generated: dict, target: str) -> WrapperSource:
    """generated maps kernel name -> TritonKernel | CppKernel | loop_python.PythonKernel
    (target "python": the loop IR run as Python, for reading and checking, never compiled)."""
    program = sched.program
    buffers = program.all_buffers()
    outputs = {o.buffer for o in program.outputs if isinstance(o, ir.TensorRef)}
    inputs = {b.name for b in program.inputs}
    # symbolic sizes: read from the inputs' sizes and strides at call time, or passed in
    size_args = [s.name for s in program.symbols if s not in program.symbol_reads]
    lines = [f"def call({', '.join([b.name for b in program.inputs] + size_args)}):"]
    for sym, (buf, kind, d) in sorted(program.symbol_reads.items(), key=lambda kv: kv[0].name):
        lines.append(f"    {sym.name} = {buf}.{kind}({d})")
    reuse = config.reuse_buffers
    # name -> (shape, stride) of the tensor bound to it, where that differs from its buffer's
    # declared layout: a recycled buffer's tensor, kept as it was (only kernels that take
    # addresses read it, so only the C++ and Triton targets; loop_python's kernels take tensors)
    actual: dict = {}
    lazy = target in ("cpp", "triton")
    pool = _ReusePool()
    pending_del: dict = {}  # pooled buffer -> index of its `del` line
    allocated: set = set()  # buffers this wrapper allocates (the only ones it may recycle)
    # buffers a kernel may write its result over: allocated ones and fresh library results
    # (never an input, an output or a view of either); in_place: those already written over
    recyclable: set = set()
    in_place: set = set()
    # memory a scatter accumulates into lives on under the scatter's name
    aliased = {s.node.target for s in sched.steps if isinstance(s, ScatterStep)}
    # a library op other than these may return a view of its operand (an eager fallback)
    for s in sched.steps:
        if isinstance(s, ir.Extern) and not s.op.fresh_result:  # (a property of the library prim)
            aliased |= s.reads()
    devices = {}
    launch_defs: list = []  # module-level launch lines (_triton_call)
    if program.seed is not None:  # fresh randomness per call, from torch's own generator
        dev = _device_name(program.seed.device)
        devices[dev] = program.seed.device
        lines.append(f"    seed = torch.randint(0, 2 ** 62, (1,), dtype=torch.int64, device={dev})")
    # names the wrapper has a value for, so far: inputs, sizes, the seed, earlier results
    bound = set(inputs) | set(size_args) | {s.name for s in program.symbol_reads} | {"seed"}
    for i, step in enumerate(sched.steps):
        if not isinstance(step, Kernel):
            bound.add(step.node.name if isinstance(step, ScatterStep) else step.name)
        if isinstance(step, ScatterStep):
            gen = generated[step.name]
            if math.prod(step.node.src_ranges):
                lines.append(f"    {_launch(gen, target, launch_defs)}")
                if getattr(gen, "checked", False):
                    lines += _check_lines(gen, "scatter_add/index_add")
            lines.append(f"    {step.node.name} = {step.node.target}  # accumulated in place")
            target_buf = buffers[step.node.target]
            have = actual.get(step.node.target) or (tuple(target_buf.shape), tuple(target_buf.stride))
            mine = buffers.get(step.node.name)
            if mine is None or have != (tuple(mine.shape), tuple(mine.stride)):
                actual[step.node.name] = have
        elif isinstance(step, Kernel):
            gen = generated[step.name]
            _check_bound(step, gen, bound)
            bound.update(step.stores)
            for name in step.stores:
                b = buffers[name]
                dev = _device_name(b.device)
                devices[dev] = b.device
                old = _in_place_source(step, name, i, sched, buffers, recyclable - in_place - outputs - aliased) \
                    if reuse and target != "cpp" else None  # (C++ kernels take __restrict__ pointers)
                if old is not None:
                    in_place.add(old)
                    lines.append(f"    # {name} is written in place over {old} (its last read)")
                else:
                    old = pool.take(b) if reuse else None
                    if old is not None:
                        lines[pending_del.pop(old)] = None
                        lines.append(f"    # reuse {old} for {name}")
                if old is not None:
                    have = actual.get(old) or (tuple(buffers[old].shape), tuple(buffers[old].stride))
                    if have == (tuple(b.shape), tuple(b.stride)):
                        lines.append(f"    {name} = {old}")
                    elif lazy:
                        # generated kernels read only its address: the name takes the old tensor
                        # as it is, and a view with its own layout is made only where a library
                        # call or the outputs need one (_ref_expr). A view is a dispatcher call
                        # (3-15 us with cold caches between kernels); a Llama backward made 14.
                        lines.append(f"    {name} = {old}")
                        actual[name] = have
                    else:
                        lines.append(f"    {name} = as_strided({old}, {py_tuple(b.shape)}, {py_tuple(b.stride)})")
                    if old not in in_place:  # an in-place source is still read: deleted after
                        lines.append(f"    del {old}")
                    allocated.add(name)
                    recyclable.add(name)
                    continue
                lines.append(f"    {name} = empty_strided({py_tuple(b.shape)}, {py_tuple(b.stride)}, "
                             f"dtype={b.dtype}, device={dev})")
                allocated.add(name)
                recyclable.add(name)
            if math.prod(step.xshape if step.is_reduction else step.shape) == 0:
                lines.append(f"    # {step.name} skipped: empty iteration space")
            elif target in ("triton", "python"):
                lines.append(f"    {_launch(gen, target, launch_defs)}")
            else:
                ptrs = ", ".join([f"{a}.data_ptr()" for a in gen.args] + gen.sizes)
                lines.append(f"    {gen.name}({ptrs})")
                if gen.checked:
                    lines += _check_lines(gen, "gather/embedding/index_select")
        elif isinstance(step, ir.ExternItem):
            lines.append(f"    {step.name} = ensure_layout({step.source}[{step.index}], "
                         f"{py_tuple(step.shape)}, {py_tuple(step.stride)})")
        else:
            if type(step) is ir.Extern and step.op.fresh_result:
                recyclable.add(step.name)  # a library's new tensor: a kernel may overwrite it
            args = [_value_text(r, buffers, actual) for r in step.inputs]
            kwargs = [f"{k}={_value_text(v, buffers, actual)}" for k, v in step.kwargs.items()]
            direct = step.op.wrapper_call(step.inputs, args, kwargs, bound=lambda name: actual.get(name) or (
                tuple(buffers[name].shape), tuple(buffers[name].stride))) if step.op.wrapper_call else None
            call = direct or f"extern_{step.op.name}({', '.join(args + kwargs)})"
            lines.append(f"    {step.name} = {call}")
            if not step.op.exact_layout and not isinstance(step, ir.MultiExtern):
                # kernels index the result with the strides meta promised; a library may pick
                # another layout (flash attention on CUDA returns [B, T, H, D] transposed)
                lines.append(f"    {step.name} = ensure_layout({step.name}, {py_tuple(step.shape)}, {py_tuple(step.stride)})")
        dead = [b for b, last in sched.last_use.items()
                if last == i and b not in outputs and b not in inputs]
        if dead:
            # a buffer that may be recycled keeps its own `del` line, dropped if it is reused
            poolable = [b for b in sorted(dead) if reuse and b in allocated and b not in aliased
                        and b not in in_place and pool.give(b, buffers[b])]  # (its storage lives on)
            rest = [b for b in sorted(dead) if b not in poolable]
            if rest:
                lines.append(f"    del {', '.join(rest)}")
            for b in poolable:
                pending_del[b] = len(lines)
                lines.append(f"    del {b}")
    outs = []
    for o in program.outputs:
        outs.append(_ref_expr(o, buffers, actual) if isinstance(o, ir.TensorRef) else _value_text(o))
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    header = [f"{d} = torch.device({str(dev)!r})" for d, dev in devices.items()] + launch_defs
    lines = [ln for ln in lines if ln is not None]
    source = "\n".join(header + [""] + lines) + "\n"
    return WrapperSource(source, list(generated.values()), sched.externs, size_args)
