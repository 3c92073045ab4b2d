"""The peer harness (benchmarks/peer_tests.py) on a small stand-in for PyTorch's
test_torchinductor.py: its loader survives imports this torch lacks, a case that matches eager
passes, a wrong answer is a mismatch; a case's own torch.compile runs kiln (``direct_*``), unless
its checks fail with the identity as well (they test Inductor), and run_and_get_code is not
kept."""
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

        def test_own_compile_matches_eager(self):
            x = torch.randn(3, 4)
            torch.testing.assert_close(torch.compile(lambda x: x.sin() + 1)(x), x.sin() + 1)

        def test_own_compile_wrong_on_purpose(self):
            import kiln
            fn = lambda x: x + (2 if kiln.is_compiling() else 1)
            x = torch.randn(3)
            torch.testing.assert_close(torch.compile(fn, backend="inductor")(x), x + 1)

        def test_own_compile_raises_what_eager_raises(self):
            with self.assertRaisesRegex(RuntimeError, "split_with_sizes"):
                torch.compile(lambda a: torch.split(a, [2, 1, 1], dim=1))(torch.randn(1, 5))

        def test_own_compile_asserts_inductor_state(self):
            x = torch.randn(3)
            torch.testing.assert_close(torch.compile(lambda t: t.cos())(x), x.cos())
            self.assertEqual(inductor_kernel_count(), 1)  # Inductor's, never moved by kiln

        def test_uses_inductor_itself(self):
            run_and_get_code(torch.compile(lambda x: x + 1), torch.randn(2))

    def inductor_kernel_count():
        return 0

    def run_and_get_code(fn, *args):
        return fn(*args), ""
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
    assert rows["test_own_compile_matches_eager_cpu"]["status"] == "direct_pass", rows
    assert rows["test_own_compile_wrong_on_purpose_cpu"]["status"] == "direct_mismatch", rows
    # kiln raised eager's RuntimeError: the case's assertRaisesRegex(RuntimeError) sees it
    assert rows["test_own_compile_raises_what_eager_raises_cpu"]["status"] == "direct_pass", rows
    # fails with torch.compile as the identity too: the case tests Inductor itself
    inductor_state = rows["test_own_compile_asserts_inductor_state_cpu"]
    assert inductor_state["status"] == "not_kept", inductor_state
    assert "fails the same way with torch.compile as the identity" in inductor_state["detail"]
    assert rows["test_uses_inductor_itself_cpu"]["status"] == "not_kept", rows
    assert "calls run_and_get_code" in rows["test_uses_inductor_itself_cpu"]["detail"]
    assert "inductor: direct_mismatch 1, direct_pass 2, mismatch 1, not_kept 2, pass 1" in proc.stderr
