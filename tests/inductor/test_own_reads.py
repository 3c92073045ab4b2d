"""A kernel's reads of values it computes itself (kiln/inductor/own_reads.py).

BERT's masked-LM head in training on the H200 (session 28) crashed at call time with
``NameError: buf0``: the cross-entropy backward's logits gradient joined the decoder bias
gradient's column-split reduction, the kernel was re-indexed onto the split's space, and the
read of the in-kernel softmax value no longer normalised to its store index (an unravel pair
split across two terms), so it fell through to a load of a buffer nobody stores. The index
normal form now merges that pair; a read that still does not match is recomputed at its
element; a kernel argument no step produced is a compile error, never a NameError."""
import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
from kiln.inductor import ir
from kiln.inductor.codegen.wrapper import _check_bound
from kiln.inductor.own_reads import OwnReadError, drop_unused, resolve_own_reads
from kiln.inductor.scheduler import Kernel
from testing import TARGETS, on_target

CPU = torch.device("cpu")


class _Head(torch.nn.Module):
    """BERT's masked-LM head and loss, at a size whose bias-gradient split (8 chunks of 128
    rows over a [16, 64] batch) does not line up with the batch rows."""

    def __init__(self, hidden, vocab):
        super().__init__()
        self.dense = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.decoder = torch.nn.Linear(hidden, vocab)

    def forward(self, x, labels):
        logits = self.decoder(self.norm(F.gelu(self.dense(x))))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mlm_head_training_with_column_split_matches_eager(target, dtype):
    torch.manual_seed(0)
    with on_target(target) as device:
        model = _Head(16, 64).to(device)
        x = torch.randn(16, 64, 16, device=device)
        labels = torch.randint(0, 64, (16, 64), device=device)

        def step(fn):
            model.zero_grad()
            xg = x.clone().requires_grad_()
            with torch.autocast(device.type, dtype, enabled=dtype != torch.float32):
                loss = fn(xg, labels)
            loss.backward()
            return [loss.detach(), xg.grad] + [p.grad.clone() for p in model.parameters()]

        want = step(model)
        kiln.reset()
        with kiln.config.patch(split_column_reductions="always", strict=True):
            got = step(kiln.compile(model))
        assert kiln.stats()["eager_runs"] == 0 and kiln.stats()["fallbacks"] == 0
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_index_normal_form_merges_an_unravel_pair_split_across_terms():
    # the read from the crash, in the split kernel's space [4, 20000, 256]: row
    # 256*i0 + i2 of the [1024, 20000] logits, unravelled over the [8, 128] batch
    i0, i1, i2 = ir.index_symbols(3)
    f = sympy.floor
    row = (128 * sympy.Mod(2 * i0 + f(i2 / 128 + f(i1 / 20000) / 128), 8)
           + sympy.Mod(i2 + f(i1 / 20000), 128) + f(sympy.Mod(i1, 20000) / 20000))
    read = sympy.Mod(i1, 20000) + 20000 * sympy.Mod(row, 1024)
    canon = ir.canonical_index_fn(ir.ranges_of((4, 20000, 256)))
    assert canon(read) == canon(5120000 * i0 + i1 + 20000 * i2)
    # and a scaled pair brought together only by expansion
    assert canon(20000 * sympy.Mod(i2, 128) + 2560000 * f(i2 / 128)) == 20000 * i2


def _pointwise(name, body, shape=(4, 6)):
    return ir.Pointwise(name, shape, (shape[1], 1), torch.float32, CPU, body)


def test_an_off_index_read_is_recomputed_at_its_element():
    i0, i1 = ir.index_symbols(2)
    a = _pointwise("a", ir.Call("exp", (ir.Load("x", 6 * i0 + i1, torch.float32),), torch.float32))
    shifted = 6 * i0 + sympy.Mod(i1 + 1, 6)  # the next column's value: another thread's
    b = _pointwise("b", ir.Call("add", (ir.Load("a", 6 * i0 + i1, torch.float32),
                                        ir.Load("a", shifted, torch.float32)), torch.float32))
    kernel = Kernel("k", a)
    kernel.add(b, "p", {})
    inlined = resolve_own_reads(kernel)
    assert inlined == {"a"}
    new_b = kernel.nodes[1]
    reads = {(ld.buffer, ld.index) for ld in ir.loads_of(new_b.body)}
    assert ("a", 6 * i0 + i1) in reads  # the read at its own element stays a register read
    x_reads = [idx for buf, idx in reads if buf == "x"]
    assert len(x_reads) == 1
    for p in range(4):  # the recomputed read is x at the shifted element, everywhere
        for q in range(6):
            point = {i0: p, i1: q}
            assert int(x_reads[0].subs(point)) == int(shifted.subs(point))
    kernel.stores = ["b"]
    drop_unused(kernel, inlined)  # a is still read at its own element: it stays
    assert [n.name for n in kernel.nodes] == ["a", "b"]


def test_a_value_read_only_off_index_is_dropped_after_recomputation():
    i0, i1 = ir.index_symbols(2)
    a = _pointwise("a", ir.Call("neg", (ir.Load("x", 6 * i0 + i1, torch.float32),), torch.float32))
    b = _pointwise("b", ir.Load("a", 6 * sympy.Mod(i0 + 1, 4) + i1, torch.float32))
    kernel = Kernel("k", a)
    kernel.add(b, "p", {})
    inlined = resolve_own_reads(kernel)
    kernel.stores = ["b"]
    drop_unused(kernel, inlined)
    assert [n.name for n in kernel.nodes] == ["b"]
    assert {ld.buffer for ld in ir.loads_of(kernel.nodes[0].body)} == {"x"}


def test_an_off_index_read_of_a_reduction_is_a_loud_error():
    i0, i1 = ir.index_symbols(2)
    r = ir.Reduction("r", (4,), (1,), torch.float32, CPU, "sum", (4, 6), (1,),
                     ir.Load("x", 6 * i0 + i1, torch.float32))
    b = ir.Pointwise("b", (4, 6), (6, 1), torch.float32, CPU,
                     ir.Load("r", sympy.Mod(i0 + 1, 4), torch.float32))
    kernel = Kernel("k", r)
    kernel.add(b, "x", {})
    with pytest.raises(OwnReadError, match=r"\[schedule\] k: b reads r"):
        resolve_own_reads(kernel)


def test_a_kernel_argument_no_step_produced_is_a_compile_error():
    a = _pointwise("a", ir.Load("x", sum(ir.index_symbols(2)), torch.float32))
    kernel = Kernel("kernel3", a)
    kernel.stores = ["a"]

    class Gen:
        args = ["x", "buf0", "a"]
    with pytest.raises(ValueError, match=r"\[codegen:wrapper\] kernel3 reads buf0"):
        _check_bound(kernel, Gen, {"x"})
    _check_bound(kernel, Gen, {"x", "buf0"})
