"""examples/train_gpt.py: a tiny GPT trained for 50 AdamW steps on the CPU with kiln.compile on
the project's own text; kiln's loss curve follows eager's, the model learns, the PNG is written."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
from testing import CUDA  # noqa: E402
import lineplot  # noqa: E402
import train_gpt  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


@pytest.fixture
def one_thread():
    """The CI machine is small and shared: torch's thread pool spinning on busy cores costs
    several times the work itself at this size."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("device", DEVICES)
def test_train_gpt_example_matches_eager(tmp_path, one_thread, device):
    out = tmp_path / "loss.png"
    # float32 on CUDA too, so both devices are held to the same tight loss tolerance
    s = train_gpt.run(device=device, size="tiny", steps=50, out=str(out), quiet=True, dtype="float32")
    eager, kiln = s["eager"]["losses"], s["kiln"]["losses"]
    print(f"eager {eager[0]:.4f} -> {eager[-1]:.4f}; kiln {kiln[0]:.4f} -> {kiln[-1]:.4f}; "
          f"largest difference {s['max_loss_diff']:.2e}; kiln/eager {s['speedup']:.2f}x")
    assert len(eager) == len(kiln) == 50
    assert s["match"], s.get("mismatch")
    # the compiled model really ran kiln's kernels, in one graph
    assert s["kernels"] > 0 and s["fallbacks"] == 0 and s["graph_breaks"] == 0
    # it learns: the mean of the last ten losses is well below the first loss
    assert kiln[-1] < kiln[0]
    assert sum(kiln[-10:]) / 10 < kiln[0] - 1.0
    assert out.exists() and lineplot.read_png_size(str(out))[0] > 100


def test_compare_flags_a_drifting_curve():
    with pytest.raises(AssertionError, match="step 3"):
        train_gpt.compare([3.0, 2.9, 2.8], [3.0, 2.9, 2.9], rtol=1e-3, atol=1e-3)
    assert train_gpt.compare([3.0, 2.9], [3.0, 2.9001], rtol=1e-3, atol=1e-3) == pytest.approx(1e-4)


def test_builtin_png_writer(tmp_path):
    path = tmp_path / "p.png"
    writer = lineplot.plot_lines(str(path), {"a": [3.0, 2.0, 1.5], "b": [3.1, 2.1, float("nan")]},
                                 title="t", use_matplotlib=False)
    assert writer == "builtin"
    assert lineplot.read_png_size(str(path)) == (640, 400)
    import zlib
    data = path.read_bytes()
    idat = data.index(b"IDAT")
    n = int.from_bytes(data[idat - 4:idat], "big")
    raw = zlib.decompress(data[idat + 4:idat + 4 + n])
    assert len(raw) == 400 * (1 + 640 * 3)
    assert len(set(raw[1:640 * 3 * 400:3])) > 2  # not a blank image: lines and text were drawn


def test_corpus_is_the_projects_own_text():
    data = train_gpt.CharData(train_gpt.build_corpus(max_chars=20000))
    assert data.vocab < 100
    x, y = data.batches(2, 3, 16, seed=0)[0]
    assert x.shape == y.shape == (3, 16)
    assert (x[:, 1:] == y[:, :-1]).all()  # targets are the inputs shifted by one
    assert data.decode(data.encode("def x")) == "def x"


def test_lr_schedule_warms_up_then_decays():
    lrs = [train_gpt.lr_at(s, 100, 1.0) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)  # ten warm-up steps
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # then never rises
    assert lrs[-1] == pytest.approx(0.1)  # down to a tenth
