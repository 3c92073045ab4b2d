"""A tensor whose size only the run knows (``x.nonzero()``), under ``fullgraph=True``, until
``torch._check`` fixes it.

``nonzero``'s row count depends on the data. Dynamo gives it an unbacked symbol; kiln's sizes
are ints or symbols bound to inputs, and its kernels take sizes from the inputs, so a size
first known inside the graph has no home. What PyTorch's own test of this case
(``test_nonzero_unbacked_refinement``) does needs none: the program states the count,
``torch._check(z.size(0) == 4)``, and everything after is static. So under ``fullgraph=True``
``x.nonzero()`` / ``torch.nonzero(x)`` is a ``SizedLaterVariable``: it answers ``z.size(0)`` /
``z.shape[0]`` with an ``UnbackedSizeVariable`` and its other dims, dtype and device as
usual; ``torch._check(size == n)`` (n a Python int) turns it into an ordinary tensor of ``n``
rows, one ``core.nonzero_rows(x, n)`` node that runs ``torch.nonzero`` and raises
eager's RuntimeError when the count differs. Any other use before that (an op on it,
returning it, branching on its size) is refused with a reason that names the missing check.
Without ``fullgraph`` nonzero stays a graph break (eager computes the real size there).

Not done: unbacked symbols proper (sizes that stay unknown through later ops), ``as_tuple=True``,
other data-dependent-shape ops (``masked_select``, ``unique``).
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, TensorVariable, Variable
from kiln.ops import core


def _missing_check(what: str) -> Unsupported:
    return Unsupported(f"data-dependent shape: {what} Tensor.nonzero's row count is only known "
                       "when it runs and kiln has no unbacked sizes; state it first with "
                       "torch._check(z.size(0) == n)")


class SizedLaterVariable(TensorVariable):
    """``x.nonzero()`` before ``torch._check`` has fixed its row count."""

    def __init__(self, tx, input_var: TensorVariable):
        super().__init__(None)
        self.input_var = input_var
        meta = input_var.proxy.meta
        self.ndim, self.device = meta.ndim, meta.device
        self.rows = None  # the checked count, once torch._check gave it

    @property
    def proxy(self):
        if self.rows is None:
            raise _missing_check("using z = x.nonzero() as a tensor:")
        return TensorVariable.proxy.fget(self)

    @proxy.setter
    def proxy(self, value):
        self._proxy = value

    def getattr(self, tx, name):
        if self.rows is not None:
            return super().getattr(tx, name)
        if name == "size":
            return _SizeMethod(self)
        if name == "shape":
            return _Shape(self)
        if name == "ndim":
            return ConstantVariable(2)
        if name == "dtype":
            return ConstantVariable(torch.int64)
        if name == "device":
            return ConstantVariable(self.device)
        raise _missing_check(f"attribute {name!r} of z = x.nonzero():")

    def dim_size(self, d: int) -> Variable:
        if d not in (0, 1, -1, -2):
            raise Unsupported(f"Tensor.size: dim {d} out of range for nonzero's 2-d result")
        return UnbackedSizeVariable(self) if d in (0, -2) else ConstantVariable(self.ndim)

    def fix_rows(self, tx, rows):
        """``torch._check(z.size(0) == rows)``: from now on z is a tensor of ``rows`` rows."""
        if type(rows) is not int or rows < 0:
            raise _missing_check(f"torch._check compares z.size(0) with {rows!r}, not a Python int:")
        if self.rows is not None:
            if rows != self.rows:  # the first check holds whenever the graph runs
                raise Unsupported(f"torch._check(z.size(0) == {rows}) contradicts the earlier "
                                  f"check for {self.rows} rows: it fails whenever it runs")
            return
        proxy = core.nonzero_rows(self.input_var.proxy, rows)
        self.rows = rows
        self.proxy = proxy
        tx._var_of_node[proxy.node] = self

    def __repr__(self):
        rows = "?" if self.rows is None else self.rows
        return f"Tensor(nonzero: int64[{rows}, {self.ndim}] rows checked later)"


class _SizeMethod(Variable):
    def __init__(self, owner):
        self.owner = owner

    def call(self, tx, args, kwargs):
        dim = args[0] if args else kwargs.get("dim")
        if dim is None:
            raise _missing_check("z.size() of z = x.nonzero():")
        return self.owner.dim_size(dim.as_python())


class _Shape(Variable):
    def __init__(self, owner):
        self.owner = owner

    def getitem(self, tx, key):
        return self.owner.dim_size(key.as_python())

    def as_python(self):
        raise _missing_check("z.shape of z = x.nonzero():")


class UnbackedSizeVariable(Variable):
    """``z.size(0)`` of a SizedLaterVariable: only ``== n`` inside ``torch._check`` is known."""

    def __init__(self, owner):
        self.owner = owner

    def python_type(self):
        return int

    def as_python(self):
        raise _missing_check("reading z.size(0) of z = x.nonzero():")

    def truth(self, tx):
        raise _missing_check("a branch on z.size(0) of z = x.nonzero():")


class RowCountFact(Variable):
    """``z.size(0) == n``: true or false only when the graph runs; torch._check makes it so."""

    def __init__(self, owner, rows):
        self.owner, self.rows = owner, rows

    def python_type(self):
        return bool

    def truth(self, tx):
        raise _missing_check(f"a branch on z.size(0) == {self.rows!r}:")

    def as_python(self):
        raise _missing_check(f"the value of z.size(0) == {self.rows!r}:")


def compare_size(tx, op: str, a, b):
    """``a op b`` where one side is an UnbackedSizeVariable: ``==`` with an int is a fact for
    torch._check; everything else needs the value."""
    size, other = (a, b) if isinstance(a, UnbackedSizeVariable) else (b, a)
    if op != "==" or not isinstance(other, ConstantVariable):
        raise _missing_check(f"operator {op} on z.size(0) of z = x.nonzero():")
    return RowCountFact(size.owner, other.value)


def checked(tx, cond) -> bool:
    """torch._check(cond) for a row-count fact: fixes the count; False for other conditions."""
    if not isinstance(cond, RowCountFact):
        return False
    cond.owner.fix_rows(tx, cond.rows)
    return True


def nonzero(tx, args, kwargs):
    """``torch.nonzero(x)`` / ``x.nonzero()`` under fullgraph=True."""
    if len(args) != 1 or not isinstance(args[0], TensorVariable) or \
            any(k != "as_tuple" or v.as_python() for k, v in kwargs.items()):
        raise Unsupported("Tensor.nonzero: only nonzero(x) is captured (as_tuple=True, out=... "
                          "are not supported)")
    return SizedLaterVariable(tx, args[0])


class NonzeroMethod(Variable):
    """The bound ``x.nonzero`` under fullgraph=True."""

    def __init__(self, var):
        self.var = var

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        return nonzero(tx, [self.var, *args], kwargs)
