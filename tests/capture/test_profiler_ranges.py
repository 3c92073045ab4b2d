"""torch.profiler.record_function in compiled code: a no-op range, no graph break, the
results eager's (kiln/capture/profiler_ranges.py). Before, each block was three breaks."""
import torch

import kiln


def _check(f, *args, graphs=1, breaks=0):
    want = f(*args)
    e = kiln.explain(f)(*args)
    assert (e.graph_count, e.graph_break_count) == (graphs, breaks), e.break_reasons
    torch.testing.assert_close(kiln.compile(f)(*args), want)


def test_record_function_blocks_are_one_graph():
    def f(x, n):
        with torch.autograd.profiler.record_function(f"block{n}"):
            y = x.sin() * 2
        with torch.profiler.record_function("second") as rf:
            assert rf is not None
            y = y + x.cos()
        return y
    _check(f, torch.randn(4, 5), 3)


def test_a_break_inside_a_range_resumes_compiled():
    def f(x):
        with torch.profiler.record_function("outer"):
            y = x * 2
            print("a graph break inside the range")
            y = y + 1
        return y.relu()
    x = torch.randn(6)
    want = f(x)
    e = kiln.explain(f)(x)
    assert e.graph_break_count == 1 and kiln.stats()["eager_runs"] == 0, e.break_reasons
    torch.testing.assert_close(kiln.compile(f)(x), want)
    assert kiln.stats()["eager_runs"] == 0


def test_an_optimizer_steps_range_is_not_a_break():
    # torch.optim's profile_hook_step wraps each step in a range named after the class
    def step(x, name):
        with torch.autograd.profiler.record_function(f"Optimizer.step#{name}.step"):
            return x - 0.1 * x.sign()
    _check(step, torch.randn(3, 3), "SGD")
