"""What the function returns is rebuilt from the graph's flat tensor outputs."""
import torch

from capture_helpers import check


def xy():
    return torch.randn(4, 8), torch.randn(4, 8)


def test_tuple_return():
    def fn(x, y):
        return x + y, x * y

    result = check(fn, xy)
    assert len(result.graph.output_node.args[0]) == 2


def test_dict_and_list_return_with_constants():
    def fn(x, y):
        return {"sum": x + y, "n": 3, "parts": [x.relu(), (y.exp(), None, 7)]}

    result = check(fn, xy)
    x, y = xy()
    out = result.rebuild(result.graph.run(x, y))
    assert set(out) == {"sum", "n", "parts"} and out["n"] == 3
    assert isinstance(out["parts"], list) and out["parts"][1][1:] == (None, 7)


def test_return_input_and_constant_only():
    def fn(x, y):
        return x

    result = check(fn, xy)
    assert len(result.graph.calls) == 0
    assert result.graph.output_node.args[0] == (result.graph.placeholders[0],)


def test_return_shape():
    def fn(x, y):
        return x.shape, x.relu()

    result = check(fn, xy)
    assert result.rebuild(result.graph.run(*xy()[:1]))[0] == torch.Size([4, 8])
