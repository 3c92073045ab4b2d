"""The tracer: state shared by all frames of one capture, and the ``trace`` entry point.

The tracer owns the graph being built, the graph inputs (each with the source expression that
fetches it), the guards, and the listing of interpreted bytecode. ``wrap`` turns a real Python
value reached from the frame's inputs into a Variable, installing the guards that make
specializing on it safe.
"""
from __future__ import annotations

import collections
import contextvars
import dataclasses
import enum
import inspect
import types

import torch

from kiln.capture.torch_modules import is_torch_module
from kiln.capture import known_constants, mutation, out_arguments, torch_api, torch_ops
from kiln.capture.builtins import is_builtin
from kiln.capture.autocast import AutocastState, wrap_autocast
from kiln.capture.binding import CLOSURE_KEY, _placeholder_name, _unbind, bind_arguments, frame_locals  # noqa: F401 (re-exported)
from kiln.capture.binding import numpy_aliases
from kiln.capture.controls import compiled_original, dim_marks, is_disabled
from kiln.capture.complex_grads import refuse_dropped_complex_grad
from kiln.capture.errors import Unsupported
from kiln.capture.tracer_helpers import ModuleGlobalsSource, _guarded_by_code, _is_hashable, _type_check  # noqa: F401 (re-exported)
from kiln.capture.guards import (AttrSource, GuardSet, ItemSource, LocalSource, Source,
                                 IntCarrierSource, add_default_guards, closure_source, make_fetch)
from kiln.capture.dynamic_floats import check_float_outputs, wrap_dynamic_float
from kiln.capture.fast_sources import fast_map
from kiln.capture.rebuild import _make_rebuild, _output_spec, _set_grad_after
from kiln.capture.instructions import listing
from kiln.capture.interpreter import Frame
from kiln.capture.resume import GradModeExit, SetGradModeVariable, finish_at_break, set_grad_mode
from kiln.capture.resume_loops import LoopRest, wrap_loop_rest
from kiln.capture.side_effects import SideEffects
from kiln.capture.values_introspect import INTROSPECT_TYPES, IntrospectVariable
from kiln.capture.values_stdlib import dict_item_source, dict_keys_check, wrap_stdlib
from kiln.capture.values_defaultdict import wrap_defaultdict
from kiln.capture.dict_keys import wrap_key
from kiln.capture.resume_cells import argument_cells
from kiln.capture.vmap import wrap_vmap
from kiln.capture.associative_scan import wrap_associative_scan
from kiln.capture.made_leaves import refuse_grad_mode_use
from kiln.capture.scalar_values import NumberVariable, python_operands, python_unary_operand
from kiln.capture.sized_later import UnbackedSizeVariable, compare_size
from kiln.capture.values_dict import (OrderedDictVariable, ContextVarVariable, is_python_dict_subclass,
                                      wrap_dict_subclass)
from kiln.capture.values_python import (NamedTupleVariable, ObjectVariable, grad_mode_decorated,
                                        wrap_grad_mode_value, is_structseq, is_user_object,
                                        ContextExitVariable, SetVariable)
from kiln.capture.values import (CellVariable, ConstantVariable, DictVariable, IteratorVariable,
                                 LazyVariable, ListVariable, MethodVariable, OpaqueVariable,
                                 PYTHON_OPERATORS, TensorVariable, TupleVariable, Variable,
                                 _Sequence, is_constant)
from kiln.capture.values_callables import (BuiltinVariable, FunctionVariable, ModuleVariable,
                                           PythonModuleVariable, TorchFunctionVariable)
from kiln.graph import Graph, Proxy
from kiln.meta import TensorMeta, defaults
from kiln.meta.tensor_meta import WrappedNumberMeta
from kiln.meta.symbolic import ShapeEnv, has_symbols, symbolic_meta
from kiln.ops import core

MAX_INLINE_DEPTH = 32
_CO_GENERATOR_LIKE = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                      | inspect.CO_ITERABLE_COROUTINE)


@dataclasses.dataclass
class CaptureResult:
    graph: Graph
    input_sources: list          # str per placeholder: expression over L (and G)
    fetch: object                # fetch(L) -> tuple of graph inputs
    fetch_source: str
    guards: list                 # str per guard: boolean expression over L and G
    guard_source: str
    guard_fn: object             # guard(L, G) -> bool
    rebuild: object              # rebuild(outputs) -> what the function returned
    bytecode: str
    code: types.CodeType
    guard_set: object = None     # the GuardSet (symbolic guards can grow after capture)
    autocast_devices: tuple = ()  # ambient torch.autocast on at capture: run with it off
    shape_env: object = None     # the ShapeEnv of symbolic sizes (None when all are static)
    break_state: object = None   # resume.BreakState when the trace stopped at a graph break

    def refresh_guards(self):
        """Regenerate the guard function: later stages may record guards on symbolic sizes."""
        if self.guard_set is None or self.shape_env is None or not self.shape_env.hints:
            return
        self.guards = self.guard_set.exprs()
        self.guard_source, self.guard_fn = self.guard_set.compile()


class Tracer:
    def __init__(self, fn_name: str, dynamic=None, auto_dynamic=None, auto_dynamic_ints=None,
                 auto_dynamic_floats=None, module_identity=False):
        self.graph = Graph(fn_name)
        self.guards = GuardSet()
        self.autocast = AutocastState(self.guards)  # torch.autocast state; casts per op
        self.graph.call_hook = self.autocast.cast_inputs
        # symbolic sizes (kiln/meta/symbolic.py): dynamic=True: every input size; False: none;
        # None: the sizes auto_dynamic names ({source expr: dims}) and kiln.mark_dynamic's
        self.dynamic = dynamic
        self.auto_dynamic = auto_dynamic or {}
        # sources of Python ints that changed between calls: traced as symbols (_wrap_dynamic_int)
        self.auto_dynamic_ints = set(auto_dynamic_ints or ())
        # sources of Python floats that changed between calls: 0-d graph inputs (dynamic_floats.py)
        self.auto_dynamic_floats = set(auto_dynamic_floats or ())
        self.float_inputs: dict = {}  # source expr -> the tracker of a dynamic float
        # modules guarded by identity (mode="reduce-overhead": a CUDA graph per instance reads
        # its parameters in place) instead of by type and structure (_wrap_module)
        self.module_identity = module_identity
        self.shape_env = ShapeEnv()
        self.shape_env.location = self._location
        self.guards.shape_env = self.shape_env
        self.input_sources: list[Source] = []
        self._tensor_inputs: dict[int, tuple[TensorVariable, Source, torch.Tensor]] = {}
        self._var_of_node: dict = {}
        self._modules_seen: dict[int, tuple] = {}  # id(module) -> (module, its ModuleVariable)
        self._real_cells: dict[int, tuple] = {}  # id(closure cell) -> (cell, its CellVariable)
        self.storages: list = []  # mutation.Storage per tensor memory that aliasing touched
        self._placeholder_names: set[str] = set()
        self.steps = 0
        self.input_items = False  # trace(input_items=...): .item() of integer inputs (item_values.py)
        self.scalar_outputs = False  # the same flag: numbers from computed tensors (scalar_values.py)
        self.side_effects = SideEffects()          # Python state written (side_effects.py)
        self.grad_enabled = torch.is_grad_enabled()  # changed by `with torch.no_grad()`
        self.made_leaves = False  # a requires_grad_() under no_grad marked a tensor (made_leaves.py)
        self._executed: list[str] = []
        self._listed_codes: dict = {}

    # ---------------------------------------------------------------- bytecode log
    def record_instruction(self, frame, inst):
        if frame.code not in self._listed_codes:
            self._listed_codes[frame.code] = listing(frame.code, frame.instructions)
        self._executed.append(f"{'  ' * frame.depth}{frame.code.co_name}:{inst.lineno} {inst}")

    def bytecode_listing(self) -> str:
        listed = "\n\n".join(self._listed_codes.values())
        return f"{listed}\n\n# executed instructions\n" + "\n".join(self._executed)

    # ---------------------------------------------------------------- wrapping real values
    @staticmethod
    def attr_source(parent: Source | None, name: str):
        return AttrSource(parent, name) if parent is not None else None

    def wrap_constant(self, value) -> Variable:
        """A value computed during the trace (no source, no guard)."""
        return self.wrap(value, None)

    def wrap(self, value, source: Source | None, guard: bool = True) -> Variable:
        """The Variable for a real value reached through ``source`` (None: made in the trace),
        with the guards that make specializing on it safe (``guard``). Tried in order: values
        of kiln's own making and special objects, numbers and constants, containers and user
        objects, then callables and opaque values; the first that knows the value wins."""
        guard = guard and source is not None
        original = compiled_original(value)
        if original is not None:  # kiln.compile inside kiln.compile: traced in this graph
            return self.wrap(original, self.attr_source(source, "fn"), guard)
        var = self._wrap_special(value, source, guard)
        if var is None:
            var = self._wrap_constant_value(value, source, guard)
        if var is None:
            var = self._wrap_container(value, source, guard)
        if var is None:
            var = self._wrap_callable(value, source, guard)
        return var

    def _wrap_special(self, value, source, guard):
        """Tensors, a resume function's markers, torch.autocast, stdlib objects, enums."""
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(value, source)
        if value is set_grad_mode:  # a resume function's prologue re-entering a grad-mode block
            return SetGradModeVariable()
        if type(value) is LoopRest:  # a for loop's remaining items, at a resume function's entry
            return wrap_loop_rest(self, value, source)
        if type(value) is GradModeExit:  # a grad-mode block's exit, passed to a resume function
            if guard:
                self.guards.identity(source, value)
            exit_var = ContextExitVariable(lambda: setattr(self, "grad_enabled", value.prev))
            exit_var.grad_prev = value.prev  # a later break rebuilds it (resume_glue._grad_prev)
            return exit_var
        special = wrap_autocast(self, value, source, guard)  # torch.autocast and its queries
        if special is None:  # torch.vmap, unrolled (vmap.py)
            special = wrap_vmap(self, value, source, guard)
        if special is None:  # torch's associative_scan, as a tree of combine calls
            special = wrap_associative_scan(self, value, source, guard)
        if special is None:  # os.environ, loggers, warnings.warn (values_stdlib.py)
            special = wrap_stdlib(self, value, source, guard)
        if special is not None:
            return special
        if type(value) in INTROSPECT_TYPES:  # inspect.Signature / Parameter: immutable
            if guard:
                self.guards.identity(source, value)
            return IntrospectVariable(value, source)
        if isinstance(value, enum.Enum):  # members are singletons: guarded by identity
            if guard:
                self.guards.identity(source, value)
            return ConstantVariable(value, source)
        return None

    def _wrap_constant_value(self, value, source, guard):
        """Python numbers (symbolic where automatic dynamic says so) and constants."""
        if type(value) is int and guard and self.dynamic is not False \
                and source.expr() in self.auto_dynamic_ints:
            var = self._wrap_dynamic_int(value, source)
            if var is not None:
                return var
        if type(value) is float and guard and source.expr() in self.auto_dynamic_floats:
            return wrap_dynamic_float(self, value, source)
        if isinstance(value, torch.Size) or is_constant(value) and not isinstance(value, tuple):
            if guard:
                if isinstance(value, type):
                    self.guards.identity(source, value)
                elif isinstance(value, (range, slice, torch.Size)):
                    self.guards.add(source, f"{{}} == {value!r}")
                else:
                    self.guards.constant(source, value)
            if isinstance(value, type) and is_builtin(value):
                return BuiltinVariable(value, source)
            return ConstantVariable(value, source)
        if type(value) in (set, frozenset) and source is None and all(is_constant(v) for v in value):
            return SetVariable([ConstantVariable(v) for v in value])
        return None

    def _wrap_container(self, value, source, guard):
        """Lists, tuples, dicts (one tracker per mutable object) and user objects."""
        if type(value) in (list, dict, collections.OrderedDict) or is_user_object(value):
            seen = self.side_effects.tracker_of(value)  # one tracker per mutable object
            if seen is not None:
                if seen.source is not None and source is not None and seen.source != source:
                    self.guards.same_object(source, seen.source)
                return seen
            if type(value) not in (list, dict, collections.OrderedDict):
                if guard:
                    self.guards.add(source, _type_check(type(value)))
                return self.side_effects.remember(value, ObjectVariable(type(value), value, source))
        if isinstance(value, (tuple, list)):
            if guard:
                self.guards.add(source, _type_check(type(value)) + f" and len({{}}) == {len(value)}")
            items = [self.wrap(v, ItemSource(source, i) if source is not None else None, guard)
                     for i, v in enumerate(value)]
            if type(value) is tuple:
                return TupleVariable(items, source)
            if type(value) is list:
                return self.side_effects.remember(value, ListVariable(items, source))
            if hasattr(type(value), "_fields") or is_structseq(type(value)):
                return NamedTupleVariable(type(value), items, source)
            raise Unsupported(f"{type(value).__name__} values are not supported")
        if type(value) is dict or type(value) is collections.OrderedDict:
            if guard:
                self.guards.add(source, dict_keys_check(value, self.guards))
            cls = DictVariable if type(value) is dict else OrderedDictVariable
            return self.side_effects.remember(value, cls(
                {wrap_key(self, k, source, i, guard): self.wrap(v, dict_item_source(source, i, k), guard)
                 for i, (k, v) in enumerate(value.items())}, source))
        if type(value) is collections.defaultdict:  # a dict that remembers its factory
            return wrap_defaultdict(self, value, source, guard)
        if is_python_dict_subclass(type(value)):  # dict's behaviour, the subclass's methods
            return wrap_dict_subclass(self, value, source, guard)
        return None

    def _wrap_callable(self, value, source, guard):
        """Modules, functions, methods, torch's callables; anything else is opaque."""
        grad_mode = wrap_grad_mode_value(self, value, source, guard)  # torch.no_grad() objects
        if grad_mode is not None:
            return grad_mode
        if isinstance(value, torch.nn.Module):
            if source is None:
                raise Unsupported(f"{type(value).__name__} module created or reached without a source")
            return self._wrap_module(value, source)
        if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType) \
                and not is_torch_module(value.__func__.__module__):
            if guard:  # a bound method is made anew on each access: guard what it binds
                self.guards.identity(self.attr_source(source, "__func__"), value.__func__)
            owner = self.wrap(value.__self__, self.attr_source(source, "__self__"), guard)
            return FunctionVariable(value.__func__, self_var=owner)
        if isinstance(value, types.BuiltinMethodType) and type(getattr(value, "__self__", None)) in (list, dict) \
                and source is not None:
            # a list's or dict's bound method handed over a graph break (``vals.append`` on the
            # stack at ``vals.append(t.item())``): the tracked container's method
            if guard:
                self.guards.add(source, _type_check(type(value)) + f" and {{}}.__name__ == {value.__name__!r}")
            owner = self.wrap(value.__self__, self.attr_source(source, "__self__"), guard)
            return MethodVariable(owner, value.__name__)
        if guard and _guarded_by_code(value):
            return self._wrap_made_function(value, source)
        if guard:
            self.guards.identity(source, value)
        if type(value) is contextvars.ContextVar:
            return ContextVarVariable(value, source)
        if isinstance(value, types.ModuleType):
            return PythonModuleVariable(value, source)
        if torch_ops.is_op(value):  # torch.ops.aten.add, aten.mul.Tensor (capture/torch_ops.py)
            return torch_ops.TorchOpVariable(value, source)
        if _is_hashable(value) and value in torch_api.TORCH_FUNCTIONS:
            return TorchFunctionVariable(value, source)
        if is_builtin(value):
            return BuiltinVariable(value, source)
        if isinstance(value, types.FunctionType) and hasattr(value, "__wrapped__") \
                and "ctx_factory" in value.__code__.co_freevars:
            return grad_mode_decorated(self, value, source)  # @torch.no_grad() on a function
        if isinstance(value, types.FunctionType):
            # kiln.disable(torch.cummax) (or torch.compiler.disable's) copies torch's
            # __module__ (functools.wraps) but must stay a break at the call, not become the
            # torch function it wraps
            if is_torch_module(value.__module__) \
                    and not is_disabled(value):
                return TorchFunctionVariable(value, source)  # torch's Python code is not inlined
            return FunctionVariable(value, source=source)
        if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            mod = getattr(value, "__module__", None) or ""
            if is_torch_module(mod) or isinstance(getattr(value, "__self__", None), type):
                return TorchFunctionVariable(value, source)
        if guard:  # an opaque value is only passed along (a resume function's numpy array...):
            self.guards.discard(source, f"id({{}}) == {id(value)}")  # its type is what was used
            self.guards.add(source, _type_check(type(value)))
        return OpaqueVariable(value, source)

    def _shared_cell(self, fn, i: int):
        """The tracker of a real closure cell already reached in this trace (the same closure
        called twice: a hook on two blocks counting calls), so a write in one call is what
        the next call reads; guarded to stay the same cell. None: not seen, or no source."""
        real = fn.fn.__closure__[i]
        seen = self._real_cells.get(id(real))
        if seen is None or fn.source is None:
            return None
        source = ItemSource(AttrSource(fn.source, "__closure__"), i)
        if source != seen[1].cell_source:
            self.guards.same_object(source, seen[1].cell_source)
        return seen[1]

    def _wrap_module(self, module: torch.nn.Module, source: Source) -> ModuleVariable:
        """A module is guarded by its type and training flag, not by identity: what the trace
        reads from it (parameters and buffers, which are graph inputs fetched per call,
        constants, submodules) is guarded through its own source, so every instance of the
        same structure (a transformer's twelve blocks) shares one entry. A module reached
        again under another source is the same tracker, guarded to stay the same object."""
        seen = self._modules_seen.get(id(module))
        if seen is not None:
            var = seen[1]
            if var.source != source:
                self.guards.same_object(source, var.source)
            return var
        if self.module_identity:
            self.guards.identity(source, module)
        else:
            self.guards.add(source, _type_check(type(module)))
            self.guards.keep_alive(type(module))  # a class made in a function: its id stays unique
        self.guards.add(source, f"{{}}.training is {module.training}")
        var = ModuleVariable(module, source)
        self._modules_seen[id(module)] = (module, var)  # holding the module keeps its id unique
        return var

    def _wrap_dynamic_int(self, value: int, source: Source):
        """A Python int that changed between calls (automatic dynamic): a symbol, its value read
        by the guard (``s2 = L['n']``) and passed to the graph through a storage-less carrier
        tensor of shape ``(n, 0)`` (``IntCarrierSource``). 0 and 1 are symbols too, bound
        ``>= 0``, since an int known to change is most often an index (the layers' ``layer_idx``,
        one entry for all layers); where one becomes a size it is specialized
        (``tensor_meta.no_small_symbols``). A negative int stays a constant."""
        if value < 0:
            return None
        sym = self.shape_env.create_int(value, source.expr())
        self.guards.add(source, "type({}) is int")
        self.guards.symbol_reads[sym.expr] = (source, "")
        meta = TensorMeta((0, 0), (1, 1), torch.uint8, torch.device("cpu"), False)
        meta.shape = (sym, 0)  # the carrier's size is the int itself, 0 and 1 included
        self.graph.placeholder(_placeholder_name(source) + "_int", meta)
        self.input_sources.append(IntCarrierSource(source))
        return ConstantVariable(sym, source)

    def _wrap_made_function(self, fn: types.FunctionType, source: Source) -> FunctionVariable:
        """A lambda or nested function (a new object per call of its maker), guarded by what
        inlining it relies on rather than by identity: its code and globals (by identity), no
        function attributes, and the layout of its defaults. Default values and closure cells
        are read through their sources (``f.__defaults__[i]``,
        ``f.__closure__[i].cell_contents``) when used, so they get the guards of any input."""
        g = self.guards
        g.add(source, _type_check(types.FunctionType))
        g.add(source, "not {}.__dict__")
        g.identity(AttrSource(source, "__code__"), fn.__code__)
        g.keep_alive(fn.__code__)  # its id stays unique while the guard lives
        g.identity(AttrSource(source, "__globals__"), fn.__globals__)
        d, k = fn.__defaults__, fn.__kwdefaults__
        g.add(AttrSource(source, "__defaults__"),
              "{} is None" if d is None else f"type({{}}) is tuple and len({{}}) == {len(d)}")
        g.add(AttrSource(source, "__kwdefaults__"),
              "{} is None" if k is None else f"type({{}}) is dict and list({{}}) == {list(k)!r}")
        var = FunctionVariable(fn, source=source)
        var.by_code = True
        return var

    def _wrap_tensor(self, t: torch.Tensor, source: Source | None) -> TensorVariable:
        if source is None:
            raise Unsupported("a tensor constant (created outside the traced inputs) is not supported")
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            hint = " (a sharded value, FSDP2 or tensor parallel: kiln compiles the code that sees " \
                "plain tensors, such as a module's forward inside FSDP2's hooks)" \
                if type(t).__name__ == "DTensor" else ""
            raise Unsupported(f"tensor subclass {type(t).__name__} is not supported{hint}")
        seen = self._tensor_inputs.get(id(t))
        if seen is not None:
            var, first_source, _ = seen
            if first_source != source:
                self.guards.same_object(source, first_source)
            return var
        dims = self._dynamic_dims(source, t)
        meta = symbolic_meta(t, dims, source.expr(), self.shape_env) if dims else TensorMeta.of(t)
        if has_symbols(meta.shape) or has_symbols(meta.stride):
            self.guards.dynamic_tensor(source, t, meta.shape, meta.stride)
        else:
            self.guards.tensor(source, t)
        name = _placeholder_name(source)
        node = self.graph.placeholder(name, meta)
        var = TensorVariable(Proxy(node), type(t), source)
        self._var_of_node[node] = var
        self._tensor_inputs[id(t)] = (var, source, t)  # keeping t alive keeps its id unique
        self.input_sources.append(source)
        return var

    def _dynamic_dims(self, source: Source, t: torch.Tensor) -> set:
        if t.dim() == 0:
            return set()
        # the marks on the tensor (kiln.mark_dynamic, torch._dynamo.mark_dynamic / mark_static)
        # count under every ``dynamic``, as torch.compile's do: a static mark wins
        marked, static = dim_marks(t)
        if self.dynamic is False:
            return marked - static
        if self.dynamic is True:
            # parameters and module buffers (reached through an attribute) keep static sizes
            s, through_attr = source, False
            while s is not None:
                through_attr |= isinstance(s, AttrSource)
                s = s.parent
            if not through_attr and type(t) is torch.Tensor:
                return set(range(t.dim())) - static
        dims = {d % t.dim() for d in self.auto_dynamic.get(source.expr(), ()) if -t.dim() <= d < t.dim()}
        return (dims | marked) - static

    def _location(self) -> str:
        frame = self._current_frame
        if frame is None:
            return ""
        filename, lineno, line = frame.location(frame.current)
        return f"{filename}:{lineno}: {line}"

    # ---------------------------------------------------------------- calling the capture table
    def unwrap(self, v: Variable, what: str):
        if isinstance(v, TensorVariable):
            return v.proxy
        if isinstance(v, ConstantVariable):
            return v.value
        if isinstance(v, (TupleVariable, ListVariable)):
            items = [self.unwrap(x, what) for x in v.items]
            return tuple(items) if isinstance(v, TupleVariable) else items
        if isinstance(v, BuiltinVariable) and v.fn in _PYTHON_DTYPES:  # torch.tensor(0, dtype=int)
            return _PYTHON_DTYPES[v.fn]
        raise Unsupported(f"{what}: argument {v} is not supported")

    def wrap_result(self, out):
        if isinstance(out, Proxy):
            var = self._var_of_node.get(out.node)
            if var is None:
                # a Python number held as a 0-d tensor (dynamic floats' arithmetic, float(t))
                kind = NumberVariable if type(out.meta) is WrappedNumberMeta else TensorVariable
                var = self._var_of_node[out.node] = kind(out)
            return var
        if isinstance(out, tuple) and not isinstance(out, torch.Size):
            return TupleVariable([self.wrap_result(o) for o in out])
        if isinstance(out, list):
            return ListVariable([self.wrap_result(o) for o in out])
        return self.wrap_constant(out)

    def call_adapter(self, adapter, args, kwargs, name: str):
        if self.made_leaves:
            refuse_grad_mode_use(self, args, kwargs, name)
        mutation.refuse_grad_read_of_written_leaf(self, args, kwargs)  # an optimizer's params
        py_args = [self.unwrap(a, name) for a in args]
        if "axis" in kwargs or "keepdims" in kwargs:
            kwargs = numpy_aliases(adapter, kwargs)
        op_kwargs, out_var = out_arguments.split_out(kwargs)  # out=t: a write of t (out_arguments.py)
        py_kwargs = {k: self.unwrap(v, name) for k, v in kwargs.items()}
        try:
            out = adapter(*py_args, **{k: py_kwargs[k] for k in op_kwargs})
        except Unsupported as e:
            if not e.reason.startswith(name):
                e.reason = f"{name}: {e.reason}"
                e.args = (e.reason,)
            raise
        except Exception as e:
            numbers = [v for v in (*args, *kwargs.values()) if isinstance(v, NumberVariable)]
            if numbers:  # a number where the op needs a Python value (a size, an option)
                raise numbers[0].unknown(f"argument of {name}") from e
            # Bad arguments or a meta rule refusing the inputs: eager torch will report it.
            raise Unsupported(f"{name} failed during capture: {type(e).__name__}: {e}") from e
        if isinstance(out, Proxy):  # computed from small constants only: a constant (known_constants)
            out = known_constants.fold(out)
        if self.grad_enabled:
            refuse_dropped_complex_grad(out, py_args, py_kwargs, name)
        if not self.grad_enabled:
            out = _detach_all(out)  # results made under no_grad carry no gradient
        if out_var is not None:
            out_arguments.refuse_overlap(self, out_var, args, op_kwargs, name)
            out = out_arguments.write_into(out, py_kwargs["out"], self.grad_enabled, name)
        # views of arguments and in-place writes (kiln/capture/mutation.py)
        result = mutation.wrap_outputs(self, out, args, kwargs, py_args, py_kwargs, name)
        if is_structseq(type(out)) and isinstance(result, TupleVariable):  # torch.return_types
            result = NamedTupleVariable(type(out), result.items)
        return result

    # ---------------------------------------------------------------- operators
    def binary_op(self, op: str, a: Variable, b: Variable) -> Variable:
        inplace = op.endswith("=") and op not in ("==", "!=", "<=", ">=")
        base = op[:-1] if inplace else op
        if isinstance(a, UnbackedSizeVariable) or isinstance(b, UnbackedSizeVariable):
            return compare_size(self, base, a, b)  # z.size(0) of z = x.nonzero() (sized_later.py)
        a, b = python_operands(self, base, a, b)  # Python's rules among numbers (scalar_values.py)
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            adapter = torch_api.BINARY_OPERATORS.get(base)
            if adapter is None:
                raise Unsupported(f"operator {base} on tensors is not supported by the capture table")
            result = self.call_adapter(adapter, [a, b], {}, f"operator {op}")
            if inplace and isinstance(a, TensorVariable) and not getattr(a, "python_float", False):
                return self._inplace_update(a, result, op)
            return result
        if isinstance(a, _Sequence) and isinstance(b, _Sequence) and base == "+":
            if inplace and isinstance(a, ListVariable):
                a.check_mutable(self)
                a.items.extend(b.items)
                return a
            if type(a) is type(b):
                return type(a)(a.items + b.items)
        if isinstance(a, _Sequence) and base == "*" and isinstance(b, ConstantVariable):
            return type(a)(a.items * b.as_python())
        fn = PYTHON_OPERATORS.get(base)
        if fn is None:
            raise Unsupported(f"operator {op} is not supported")
        try:
            x, y = a.as_python(), b.as_python()
        except Unsupported:
            raise Unsupported(f"operator {op} between {a} and {b} is not supported") from None
        try:
            return self.wrap_constant(fn(x, y))
        except Exception as e:
            raise Unsupported(f"{x!r} {op} {y!r} raised {e!r}") from None

    def _inplace_update(self, target: TensorVariable, result: TensorVariable, op: str):
        # functionalized: the write reaches target's storage and every alias of it
        mutation.mutate(self, target, result.proxy, f"operator {op}")
        return target

    def setitem(self, target: TensorVariable, key: Variable, value: Variable):
        mutation.setitem(self, target, key, value)

    def unary_op(self, op: str, v: Variable) -> Variable:
        v = python_unary_operand(self, op, v)
        if isinstance(v, TensorVariable):
            return self.call_adapter(torch_api.UNARY_OPERATORS[op], [v], {}, f"unary {op}")
        x = v.as_python()
        return self.wrap_constant({"-": lambda: -x, "+": lambda: +x, "~": lambda: ~x}[op]())

    def getitem(self, container: Variable, key: Variable) -> Variable:
        if isinstance(container, (_Sequence, DictVariable, ModuleVariable)) or \
                hasattr(container, "getitem"):
            return container.getitem(self, key)
        if isinstance(container, TensorVariable):
            adapter = torch_api.TENSOR_METHODS.get("__getitem__")
            if adapter is None:
                raise Unsupported("tensor indexing is not supported by the capture table")
            return self.call_adapter(adapter, [container, key], {}, "tensor indexing")
        try:
            return self.wrap_constant(container.as_python()[key.as_python()])
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"subscript raised {e!r}") from None

    # ---------------------------------------------------------------- inlining
    def inline_call(self, fn: FunctionVariable, args, kwargs, parent: Frame | None = None,
                    suspend: bool = False):
        """Inline ``fn``; with ``suspend`` (a generator's ``contextlib.contextmanager`` body,
        values_stdlib.py) the frame stops at its first yield and is returned to be resumed."""
        code = fn.code
        generator = code.co_flags & inspect.CO_GENERATOR and not code.co_flags & (
            inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE)
        if code.co_flags & _CO_GENERATOR_LIKE and not generator:
            raise Unsupported(f"calling coroutine {fn.qualname} is not supported")
        parent = parent or self._current_frame
        if parent is not None and parent.depth + 1 > MAX_INLINE_DEPTH:
            raise Unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls")
        locals_ = bind_arguments(fn, self, args, kwargs)
        cells = {}
        for i, name in enumerate(code.co_freevars):
            cell = fn.closure[i] if fn.fn is None else None
            if cell is None:
                cell = self._shared_cell(fn, i)
            if cell is None:
                real = fn.fn.__closure__[i]
                try:
                    contents = real.cell_contents
                except ValueError:
                    contents_var = None
                else:
                    src = closure_source(fn.source, i) if fn.source is not None else None
                    contents_var = LazyVariable(contents, src)
                cell = CellVariable(contents_var)
                if fn.source is not None:  # a write to it is replayed into the real cell
                    cell.cell_source = ItemSource(AttrSource(fn.source, "__closure__"), i)
                    self._real_cells[id(real)] = (real, cell)
            cells[name] = cell
        module = (fn.fn.__module__ if fn.fn is not None else None) or fn.globals.get("__name__", "") or ""
        trusted = is_torch_module(module)
        globals_source = self._globals_source(fn)
        frame = Frame(self, code, fn.globals, globals_source, locals_, cells, parent=parent,
                      trusted=trusted)
        if generator and suspend:
            frame.yielded, frame.suspend_at_yield = [], True
            self.run_frame(frame)
            return frame
        if generator:
            # A generator runs to its end at the call: what it yields is the iterator's items
            # (consumers such as sum(), tuple() or a for loop then see them in order).
            frame.yielded = []
            self.run_frame(frame)
            items = IteratorVariable(frame.yielded)
            items.from_generator = True  # a graph break cannot resume inside a loop over it
            return items
        return self.run_frame(frame)

    _current_frame: Frame | None = None

    def run_frame(self, frame: Frame) -> Variable:
        prev = self._current_frame
        self._current_frame = frame
        try:
            return frame.run()
        finally:
            self._current_frame = prev

    def _globals_source(self, fn: FunctionVariable):
        if fn.globals is self.root_globals:
            return None
        if fn.source is not None:
            return AttrSource(fn.source, "__globals__")
        return ModuleGlobalsSource(fn.globals.get("__name__", "?"))


# Python's number types where torch takes a dtype, as torch reads them
_PYTHON_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


def _detach_all(out):
    if isinstance(out, Proxy):
        if not out.meta.requires_grad:
            return out
        if not hasattr(core, "detach"):
            raise Unsupported("an op under torch.no_grad() on a tensor that requires grad")
        return core.detach(out)
    if isinstance(out, (tuple, list)) and not isinstance(out, torch.Size):
        return type(out)(_detach_all(o) for o in out)
    return out


def trace(fn, args: tuple = (), kwargs: dict | None = None, dynamic=None,
          auto_dynamic=None, plan=None, auto_dynamic_ints=None, auto_dynamic_floats=None,
          module_identity=False, input_items=False) -> CaptureResult:
    """Interpret ``fn(*args, **kwargs)``'s bytecode symbolically; see the module docstring.
    ``dynamic`` / ``auto_dynamic``: which input sizes are symbolic (``Tracer``).
    ``plan`` (a ``resume.BreakPlan``): stop before a graph break; the result's ``break_state``
    then says what the glue must rebuild, and the graph returns the live tensors.
    ``input_items`` (fullgraph=True): ``.item()`` of an unwritten integer input tensor is its
    value, guarded (capture/item_values.py), instead of a graph break; ``float(t)`` / ``int``
    / ``bool`` / ``.item()`` of other tensors is a number inside the graph (scalar_values.py)."""
    kwargs = kwargs or {}
    func, bound_self = _unbind(fn)
    code = func.__code__
    if code.co_flags & _CO_GENERATOR_LIKE:
        raise Unsupported(f"capturing generator or coroutine {func.__qualname__} is not supported",
                          code.co_filename, code.co_firstlineno, "")
    try:
        L = frame_locals(fn, args, kwargs)
    except TypeError as e:
        raise Unsupported(f"calling {func.__qualname__}: {e}", code.co_filename,
                          code.co_firstlineno, "") from None
    tx = Tracer(_graph_name(code.co_name), dynamic, auto_dynamic, auto_dynamic_ints,
                auto_dynamic_floats, module_identity)
    tx.root_globals = func.__globals__
    tx.input_items = input_items
    tx.scalar_outputs = input_items  # fullgraph=True: float(t) of computed tensors (scalar_values.py)
    grad_at_entry = tx.grad_enabled
    nparams = code.co_argcount + code.co_kwonlyargcount
    nparams += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    locals_ = {name: LazyVariable(L[name], LocalSource(name)) for name in code.co_varnames[:nparams]
               if name in L}
    cells = argument_cells(tx, code, L)  # a resume function's cells, passed in (resume_cells.py)
    for name in cells:
        locals_.pop(name, None)
    locals_.update({name: LazyVariable(L[name], LocalSource(name))
                    for name in code.co_cellvars if name in L and name not in locals_
                    and name not in cells})
    for i, name in enumerate(code.co_freevars):
        cells[name] = CellVariable(LazyVariable(L[name], LocalSource(name)) if name in L else None)
        cells[name].cell_source = ItemSource(LocalSource(CLOSURE_KEY), i)
    root = Frame(tx, code, func.__globals__, None, locals_, cells)
    if plan is not None:
        root.stop_at = plan.stop_at
    with defaults.watching() as default_reads:  # torch's default dtype and device, guarded below
        ret = tx.run_frame(root)

    proxies: list[Proxy] = []
    filename, lineno, line = root.location(root.current)
    break_state = None
    if plan is not None:
        if ret is not None or root.ip != plan.stop_at:
            raise Unsupported("the re-trace for a graph break did not stop at the break")
        break_state = finish_at_break(tx, root, plan)
        proxies = [v.proxy for v in break_state.outputs]
        try:  # Python-state writes before the break are replayed before the glue runs
            effects = tx.side_effects.plan(lambda v: _output_spec(v, proxies))
        except Unsupported as e:
            e.locate(filename, lineno, line)
            raise
        spec = ("effects", ("const", None), effects) if effects else ("const", None)
    else:
        try:
            spec = _output_spec(ret, proxies)
            effects = tx.side_effects.plan(lambda v: _output_spec(v, proxies))
        except Unsupported as e:
            e.locate(filename, lineno, line)
            raise
        spec = ("effects", spec, effects) if effects else spec
    try:  # mutated inputs: extra outputs, written back after the graph runs
        live = ret if break_state is None else list(break_state.outputs)
        tx.graph.input_mutations = mutation.finalize(tx, live, proxies, break_state is not None)
    except Unsupported as e:
        e.locate(filename, lineno, line)
        raise
    with tx.graph.inherit(source=f"{filename}:{lineno}: {line}"):
        tx.graph.output(tuple(proxies))
    mutation.promise_written_layouts(tx.graph)
    if tx.float_inputs:
        check_float_outputs(tx.graph)

    input_sources = [s.expr() for s in tx.input_sources]
    # the fetch runs only where the guard passed: it may rely on the guard's class checks
    fetch_source, fetch = make_fetch(tx.input_sources, func.__globals__,
                                     fast_map(tx.input_sources, L, func.__globals__, tx.guards.typed(),
                                              tx.guards.checked))
    # guards the ambient autocast state; a region still open at a break is re-entered for real
    # by the glue (resume.py), so the resume function sees it as ambient autocast
    autocast_devices = tx.autocast.finish(tx.graph, at_break=break_state is not None)
    add_default_guards(tx.guards, default_reads)
    guard_source, guard_fn = tx.guards.compile(L, func.__globals__)
    result = CaptureResult(
        graph=tx.graph, input_sources=input_sources, fetch=fetch, fetch_source=fetch_source,
        guards=tx.guards.exprs(), guard_source=guard_source, guard_fn=guard_fn,
        rebuild=_make_rebuild(spec, func.__globals__), bytecode=tx.bytecode_listing(), code=code,
        guard_set=tx.guards, shape_env=tx.shape_env if tx.shape_env.hints else None,
        autocast_devices=autocast_devices)
    result.break_state = break_state
    # the capture outlives the call: it holds no tensor of it (issue 24, item 6). The shape
    # env's location callback is the tracer's (the tensors it saw, by id); later stages'
    # guards have no trace position anyway.
    tx.shape_env.location = None
    tx._tensor_inputs.clear()
    if break_state is None and tx.grad_enabled != grad_at_entry:
        # the frame leaves grad mode changed (a resume function that exits a no_grad block)
        result.rebuild = _set_grad_after(result.rebuild, tx.grad_enabled)
    return result


def _graph_name(name: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return name if name.isidentifier() else "forward"


__all__ = ["trace", "CaptureResult", "Tracer", "frame_locals"]
