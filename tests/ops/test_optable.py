"""Every entry of the op table (tests/ops/optable), run each way and compared with plain torch:
the core ops' eager implementations (captured graph through graph.run), the decomposition to
prims through graph.run, kiln.compile(backend="aot_eager") and kiln.compile(backend="kiln") on
each code-generation target. Output dtype and shape must equal torch's exactly; values agree
within the dtype's tolerance. Entries kiln cannot run yet are strict expected failures.

Bad input: a call eager torch rejects raises the same exception type under kiln.compile, and the
traceback's last frame outside kiln and torch is the user's line.
"""
import os
import traceback

import pytest

import kiln
from optable import BAD, ENTRIES
from optable.runner import WAYS, marks_for, run


def _params():
    out = []
    for entry in ENTRIES:
        for way in WAYS:
            strict, known = marks_for(entry, way)
            marks = []
            if strict:
                marks.append(pytest.mark.xfail(reason=strict, strict=True))
            elif known:
                marks.append(pytest.mark.xfail(reason=known, strict=False))
            out.append(pytest.param(entry, way, marks=marks, id=f"{entry.name}-{way}"))
    return out


@pytest.mark.parametrize("entry,way", _params())
def test_op(entry, way):
    run(entry, way)


_KILN_DIR = os.path.dirname(kiln.__file__)
_TORCH_DIR = os.path.dirname(__import__("torch").__file__)


def _last_user_frame(tb):
    frames = [f for f in traceback.extract_tb(tb)
              if not f.filename.startswith((_KILN_DIR, _TORCH_DIR))]
    return frames[-1]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("case", BAD, ids=[b.name for b in BAD])
def test_bad_input_raises_like_eager(case, backend):
    args = case.make()
    with pytest.raises(Exception) as eager:
        case.fn(*args)
    with pytest.raises(type(eager.value)) as got:
        kiln.compile(case.fn, backend=backend, fullgraph=True)(*args)
    frame = _last_user_frame(got.tb)
    code = case.fn.__code__
    lines = {line for _, _, line in code.co_lines() if line is not None}
    assert frame.filename == code.co_filename and frame.lineno in lines, \
        f"last user frame is {frame.filename}:{frame.lineno}, expected {code.co_filename}:{sorted(lines)}"
