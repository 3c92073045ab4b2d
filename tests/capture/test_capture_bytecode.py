"""Decoding and the opcode handler table (the version-specific seam)."""
import dis
import sys

import torch

from kiln.capture import trace
from kiln.capture.instructions import decode
from kiln.capture.interpreter import ALL_HANDLERS, HANDLERS

PY = sys.version_info[:2]


def test_handlers_are_registered_for_real_opcodes_with_doc_links():
    for name, spec in HANDLERS.items():
        assert name in dis.opmap, f"{name} is not an opcode on {PY}"
        assert spec.versions[0] <= PY <= spec.versions[1]
        assert spec.doc.startswith("https://docs.python.org/") and spec.doc.endswith(name)
    # both versions we support are covered by some registration of these
    for name in ("LOAD_ATTR", "CALL", "FOR_ITER", "BINARY_OP", "COMPARE_OP", "LOAD_GLOBAL"):
        assert name in HANDLERS
    versions = {spec.opname: spec.versions for spec in ALL_HANDLERS}
    assert versions["RETURN_CONST"] == ((3, 12), (3, 12))
    assert versions["PRECALL"] == ((3, 11), (3, 11))


def test_decode_resolves_jumps_flags_and_kw_names():
    def fn(x, n):
        for i in range(n):
            x = torch.add(x, i, alpha=2)
        return x.relu()

    insts = decode(fn.__code__)
    assert all(i.opname != "CACHE" for i in insts)
    for inst in insts:
        if inst.opname.startswith(("JUMP", "POP_JUMP", "FOR_ITER")):
            assert inst.target is not None and insts[inst.target].offset == inst.argval
    globals_ = [i for i in insts if i.opname == "LOAD_GLOBAL"]
    assert {i.argval for i in globals_} == {"range", "torch"} and all(i.flag for i in globals_)
    kw = [i for i in insts if i.opname == "KW_NAMES"]
    assert kw and kw[0].argval == ("alpha",)
    assert all(i.lineno is not None for i in insts)


def test_bytecode_listing_in_result():
    def fn(x):
        return x.relu() + 1

    result = trace(fn, (torch.randn(4, 8),), {})
    assert result.code is fn.__code__
    assert "BINARY_OP" in result.bytecode and "return x.relu() + 1" in result.bytecode
    assert "# executed instructions" in result.bytecode


def test_version_specific_opcodes_are_exercised():
    def fn(x, xs):
        ts = [t * 2 for t in xs]            # 3.12: inlined comprehension (LOAD_FAST_AND_CLEAR, END_FOR)
        head = xs[:2]                       # 3.12: BINARY_SLICE
        both = torch.add(x, *head[1:], alpha=1)  # 3.12: CALL_INTRINSIC_1 list->tuple; 3.11: LIST_TO_TUPLE
        total = x.relu()                    # 3.12: LOAD_ATTR with the method bit; 3.11: LOAD_METHOD
        for t in ts:
            total = total + t
        return total + both

    xs = (torch.randn(4, 8), torch.randn(4, 8))
    result = trace(fn, (torch.randn(4, 8), xs), {})
    executed = result.bytecode.split("# executed instructions")[1]
    expected = {(3, 11): ["LOAD_METHOD", "PRECALL", "FOR_ITER", "MAKE_FUNCTION", "LIST_TO_TUPLE"],
                (3, 12): ["LOAD_FAST_AND_CLEAR", "BINARY_SLICE", "CALL_INTRINSIC_1", "FOR_ITER"]}
    for opname in expected.get(PY, []):
        assert opname in executed, opname
    x, = result.fetch({"x": torch.ones(4, 8), "xs": xs})[:1]
    out = result.rebuild(result.graph.run(*result.fetch({"x": x, "xs": xs})))
    torch.testing.assert_close(out, fn(x, xs))


def test_return_constant():
    def fn(x, n):
        if n > 1:
            return None
        return x

    result = trace(fn, (torch.randn(4, 8), 2), {})
    assert result.rebuild(result.graph.run(*result.fetch({"x": torch.randn(4, 8), "n": 2}))) is None
