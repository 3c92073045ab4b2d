"""The peer harness (benchmarks/peer_tests.py) on a small stand-in for PyTorch's
test_torchinductor.py: its loader survives imports this torch lacks, a case that matches eager
passes, a wrong answer is a mismatch, and a case that calls torch.compile itself is not kept."""
import json
import subprocess
import sys
import textwrap

STAND_IN = textwrap.dedent('''
    import unittest
    import torch
    from torch._inductor.no_such_module import something_gone  # this torch lacks it

    class TestCase(unittest.TestCase):
        pass

    def copy_tests(my_cls, other_cls, suffix):
        for name, value in my_cls.__dict__.items():
            if name.startswith("test_"):
                setattr(other_cls, f"{name}_{suffix}", lambda self, value=value: value(self))

    class CommonTemplate:
        @something_gone
        def test_relu_add(self):
            self.common(lambda x, y: torch.relu(x + y), (torch.randn(4, 5), torch.randn(5)))

        def test_wrong_on_purpose(self):
            import kiln
            # kiln.is_compiling() is True while kiln traces: eager and compiled differ
            self.common(lambda x: x + (2 if kiln.is_compiling() else 1), (torch.randn(3),))

        def test_uses_inductor_itself(self):
            torch.compile(lambda x: x + 1)(torch.randn(2))
''')


def test_peer_harness_classifies_cases(tmp_path):
    src = tmp_path / "test_torchinductor.py"
    src.write_text(STAND_IN)
    out = tmp_path / "peer.jsonl"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.peer_tests", "--inductor", str(src),
                           "--out", str(out), "--jobs", "1", "--timeout", "120"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {json.loads(line)["case"].split(".")[-1]: json.loads(line) for line in open(out)}
    assert rows["test_relu_add_cpu"]["status"] == "pass", rows["test_relu_add_cpu"]
    assert rows["test_relu_add_cpu"]["kiln_calls"] == 1
    assert rows["test_wrong_on_purpose_cpu"]["status"] == "mismatch", rows
    assert rows["test_uses_inductor_itself_cpu"]["status"] == "not_kept", rows
    assert "inductor: mismatch 1, not_kept 1, pass 1" in proc.stderr
