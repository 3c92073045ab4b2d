"""A compiled module behaves like torch.compile's OptimizedModule (issue 27): attribute writes
reach the original module (and the compiled forward sees them), ``training`` is the original's,
state_dict keys are torch.compile's, and copies, pickles and torch.save rebuild the wrapper."""
import copy
import io
import pickle

import pytest
import torch

import kiln


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.scale = 2
        self.shift = 0.5
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale + self.shift


def _eager_of(m, x):
    return m(x)


def test_attribute_writes_reach_the_original_and_the_compiled_forward():
    m = Scaled().eval()
    c = kiln.compile(m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(c(x), m(x))
    c.scale = 3
    assert m.scale == 3 and "scale" not in c.__dict__
    torch.testing.assert_close(c(x), m.lin(x) * 3 + 0.5)
    c.shift = -1.25
    torch.testing.assert_close(c(x), m.lin(x) * 3 - 1.25)
    c.extra = "new"  # a new attribute lands on the original too, and reads back through c
    assert m.extra == "new" and c.extra == "new"
    del c.extra
    assert not hasattr(m, "extra")
    new_lin = torch.nn.Linear(4, 3)  # a submodule replaced through the wrapper
    c.lin = new_lin
    assert m.lin is new_lin
    torch.testing.assert_close(c(x), new_lin(x) * 3 - 1.25)


def test_training_is_the_original_modules_flag():
    m = Scaled()
    c = kiln.compile(m)
    torch_c = torch.compile(Scaled())
    x = torch.randn(8, 4)
    for flip in (lambda w: w.eval(), lambda w: w.train(), lambda w: setattr(w, "training", False)):
        flip(c)
        flip(torch_c)
        assert c.training == m.training == torch_c.training
        assert m.drop.training == torch_c._orig_mod.drop.training
    c.eval()  # setattr above flipped the top flag only; eval() turns dropout off everywhere
    assert not m.drop.training
    torch.testing.assert_close(c(x), m(x))


def test_state_dict_keys_match_torch_compile_and_load_both_ways():
    m = Scaled()
    c = kiln.compile(m)
    t = torch.compile(Scaled())
    assert list(c.state_dict()) == list(t.state_dict())
    assert all(k.startswith("_orig_mod.") for k in c.state_dict())
    other = kiln.compile(Scaled())
    other.load_state_dict(c.state_dict())  # compiled -> compiled
    plain = Scaled()
    plain.load_state_dict(c._orig_mod.state_dict())  # the original's keys, as with torch.compile
    x = torch.randn(2, 4)
    c.eval(), other.eval(), plain.eval()
    torch.testing.assert_close(other(x), m.eval()(x))
    torch.testing.assert_close(plain(x), m(x))
    # plain <-> compiled with mismatched keys raises exactly where torch.compile's raises
    for target, source in ((Scaled(), c), (kiln.compile(Scaled()), Scaled())):
        with pytest.raises(RuntimeError, match="_orig_mod"):
            target.load_state_dict(source.state_dict())
    with pytest.raises(RuntimeError, match="_orig_mod"):
        Scaled().load_state_dict(t.state_dict())


def _round_trips():
    def pickled(c):
        return pickle.loads(pickle.dumps(c))

    def saved(c):
        buf = io.BytesIO()
        torch.save(c, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)
    return {"deepcopy": copy.deepcopy, "pickle": pickled, "torch.save": saved}


@pytest.mark.parametrize("how", list(_round_trips()))
def test_copies_rebuild_the_wrapper_and_compile_again(how):
    m = Scaled().eval()
    c = kiln.compile(m, dynamic=False, name="scaled")
    x = torch.randn(2, 4)
    c(x)  # compiled once: its caches and code objects must not be copied
    c.scale = 5
    d = _round_trips()[how](c)
    assert type(d) is kiln.CompiledModule
    assert d._compiled_forward is not c._compiled_forward
    assert d._compiled_forward.name == "scaled" and d._compiled_forward.dynamic is False
    assert d.scale == 5 and not d.training
    for p, q in zip(c.parameters(), d.parameters()):
        assert p is not q and p.data_ptr() != q.data_ptr()
        torch.testing.assert_close(p, q)
    before = kiln.stats()["frames_compiled"]
    y = torch.randn(2, 4)
    torch.testing.assert_close(d(y), m(y))
    assert kiln.stats()["frames_compiled"] == before + 1  # its own module: compiled for it
    with torch.no_grad():
        d._orig_mod.lin.weight.add_(1.0)  # the copy's parameters are its own
    torch.testing.assert_close(c(y), m(y))
    assert not torch.allclose(d(y), c(y))


def test_shallow_copy_shares_the_module():
    m = Scaled().eval()
    c = kiln.compile(m)
    d = copy.copy(c)
    assert type(d) is kiln.CompiledModule and d._orig_mod is m
    x = torch.randn(2, 4)
    torch.testing.assert_close(d(x), m(x))


def test_top_module_hooks_still_run_after_a_copy():
    m = Scaled().eval()
    m.register_forward_hook(lambda mod, args, out: out * 10)
    c = copy.deepcopy(kiln.compile(m))
    x = torch.randn(2, 4)
    torch.testing.assert_close(c(x), m(x))
    torch.testing.assert_close(c(x), (m.lin(x) * 2 + 0.5) * 10)


def test_len_and_dir_are_the_original_modules():
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    c = kiln.compile(seq)
    assert len(c) == len(torch.compile(seq)) == 2
    assert "lin" in dir(kiln.compile(Scaled())) and "_orig_mod" in dir(c)
    with pytest.raises(TypeError):
        len(kiln.compile(Scaled()))
    assert kiln.compile(Scaled()) and c and not kiln.compile(torch.nn.Sequential())


class Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.use_offset = True
        self.offset = torch.ones(3)  # a plain tensor attribute (not a buffer)

    def forward(self, x):
        return x + self.offset if self.use_offset else x * 2


def test_written_flags_and_tensor_attributes_are_guarded():
    m = Flagged()
    c = kiln.compile(m)
    x = torch.randn(3)
    torch.testing.assert_close(c(x), x + 1)
    c.use_offset = False  # a branch taken on the flag: the guard on it fails, a recompile
    torch.testing.assert_close(c(x), x * 2)
    c.use_offset = True
    c.offset = torch.full((3,), 5.0)  # a new tensor: read per call, not baked in
    torch.testing.assert_close(c(x), x + 5)
    c.offset = torch.full((2, 3), -1.0)  # another shape: a recompile
    torch.testing.assert_close(c(x), x + torch.full((2, 3), -1.0))
    assert "offset" not in c.__dict__ and "use_offset" not in c.__dict__


class Doubled(Scaled):
    def forward(self, x):
        return super().forward(x) * 2


def test_the_forward_called_is_the_modules_forward_at_call_time():
    """m(x) calls whatever m.forward is when called, as torch.compile's wrapper (which compiles
    m.__call__) does: a forward set on the instance after compiling, its removal, and a
    changed class each run their own compiled forward."""
    torch.manual_seed(0)
    m = Scaled().eval()
    c = kiln.compile(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        m.forward = lambda inp: m.lin(inp) - 1.0
        torch.testing.assert_close(c(x), m(x))
        del m.forward
        torch.testing.assert_close(c(x), m(x))
        m.__class__ = Doubled
        torch.testing.assert_close(c(x), m(x))
        m.__class__ = Scaled
        torch.testing.assert_close(c(x), m(x))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_runs"] == 0
