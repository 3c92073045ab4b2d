"""KILN_LOGS: every channel DESIGN.md section 3 lists exists and KILN_LOGS=help lists it; each one
prints something at its default level, and ``+channel`` prints more, for a program with a graph
break (a resume function), a backward, a recompile and symbolic sizes."""
import pytest
import torch

import kiln
from kiln import log
from testing import INTERPRET

DESIGN_CHANNELS = ["graph", "guards", "graph_breaks", "recompiles", "bytecode", "aot", "decomp",
                   "ir", "schedule", "kernels", "output_code", "perf"]
MORE_CHANNELS = ["dynamic", "cache", "autotune"]


def step(x, w):
    y = torch.relu(x @ w) * 2
    print("norm", y.norm())
    n = y.shape[0]
    return (y.sigmoid() + 1).reshape(n // 2, -1).sum(dim=1)


def _program():
    w = torch.randn(8, 4, requires_grad=True)
    f = kiln.compile(step)
    for n in (4, 6):  # the second size recompiles with a symbolic size
        f(torch.randn(n, 8), w).sum().backward()


def _lines(spec, capsys, run=_program):
    kiln.reset()
    log.configure(spec)
    try:
        run()
    finally:
        log.configure("")
    err = capsys.readouterr().err
    out: dict = {}
    for line in err.splitlines():
        if line.startswith("[kiln:"):
            channel = line[len("[kiln:"):].split("]")[0].split(" ")[0]
            current = out.setdefault(channel, [])
        elif not out:
            continue
        current.append(line)
    return out


def test_help_lists_every_channel_with_both_levels(capsys):
    text = log.help_text()
    for ch in DESIGN_CHANNELS + MORE_CHANNELS:
        assert f"  {ch} " in text, ch
        concise, verbose = log.CHANNELS[ch]
        assert concise in text and verbose in text
    log.configure("help")
    log.configure("")
    assert "+name for verbose" in capsys.readouterr().err
    with pytest.raises(KeyError, match="no_such"):
        log.log("no_such", "x")


def test_every_channel_logs_at_both_levels(capsys):
    channels = [c for c in DESIGN_CHANNELS + MORE_CHANNELS if c != "autotune"]
    concise = _lines(",".join(channels), capsys)
    verbose = _lines(",".join("+" + c for c in channels), capsys)
    for ch in channels:
        assert concise.get(ch), f"KILN_LOGS={ch} printed nothing"
        c_text, v_text = "\n".join(concise[ch]), "\n".join(verbose.get(ch, []))
        assert len(v_text) > len(c_text), f"+{ch} printed no more than {ch}"
    text = {ch: "\n".join(lines) for ch, lines in verbose.items()}
    # what each channel is for, spot-checked
    assert "resumes compiled in step_resume" in text["graph_breaks"]
    assert "recompiling step" in text["recompiles"] and "x.shape changed" in text["recompiles"]
    assert "create symbol s0" in text["dynamic"]
    assert "backward graph of step" in text["aot"] and "saved tensors of" in text["aot"]
    assert "fuse " in text["schedule"] and "kernels," in text["schedule"]
    assert "generated kiln_kernel0" in text["kernels"] and "test_logs.py:" in text["kernels"]
    assert "launch kiln_kernel0" in text["output_code"]
    assert "executed instructions" in text["bytecode"]
    assert "executed instructions" not in "\n".join(concise["bytecode"])
    # a line logged during a compile names the compile (the debug dump folder's number)
    assert any(line.startswith("[kiln:graph #") for line in verbose["graph"])


@pytest.mark.skipif(not INTERPRET, reason="autotuning on the CPU needs the Triton interpreter")
def test_autotune_channel_at_both_levels(capsys, tmp_path):
    def run(sub):
        def go():
            with kiln.config.patch(cpu_backend="triton", triton_autotune="interpret",
                                   cache_dir=str(tmp_path / sub)):
                kiln.compile(lambda x: torch.relu(x) * 2)(torch.randn(256, 256))
        return go
    concise = _lines("autotune", capsys, run("a"))
    verbose = _lines("+autotune", capsys, run("b"))
    assert any("chose variant" in ln for ln in concise["autotune"])
    assert len(verbose["autotune"]) > len(concise["autotune"])
    assert any(" took " in ln for ln in verbose["autotune"])
