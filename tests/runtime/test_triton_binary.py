"""kiln's binary records (runtime/triton_binary.py): a first launch loads the compiled kernel
from the record instead of going through Triton's JIT and its cache key.

On a CPU machine a build worker still compiles a real kernel for an sm_90 target (Triton ships
ptxas), so the record's round trip up to the ``CompiledKernel`` is tested here; loading it onto
a GPU and launching it is the CUDA test at the end."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.runtime import build_worker, triton_binary, triton_record
from kiln.runtime.launch import FastLauncher
from tests.testing import config_env

KERNEL = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def kiln_kernel0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * 2.0, xmask)
""")

REQ_ARGS = [["ptr", "float32", 16], ["ptr", "float32", 16], ["int", 4096]]
KWARGS = {"XBLOCK": 1024, "num_warps": 4}


def _worker_build(tmp_path):
    """Compile KERNEL in a real build worker (no interpreter) and return its answer."""
    pytest.importorskip("triton")
    src = tmp_path / "k.py"
    src.write_text(KERNEL)
    tcache = tmp_path / "tcache"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tcache)
    req = {"id": 1, "kind": "triton", "path": str(src), "module": "kiln_triton_test0", "name": "kiln_kernel0",
           "target": ["cuda", 90, 32], "args": REQ_ARGS, "kwargs": KWARGS, "record": True}
    proc = subprocess.run([sys.executable, build_worker.__file__], input=json.dumps(req) + "\n",
                          capture_output=True, text=True, env=env, timeout=300)
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    if not reply["ok"]:
        pytest.skip(f"this Triton cannot compile for sm_90 here: {reply['error'].splitlines()[0]}")
    return reply, tcache


def test_a_worker_record_round_trips_to_the_compiled_kernel(tmp_path, monkeypatch):
    reply, tcache = _worker_build(tmp_path)
    record = reply["record"]
    assert record is not None, reply.get("record_error")
    assert all(not os.path.isabs(p) for p in record["files"].values())  # relative to the cache dir
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tcache))
    kernel = triton_binary.construct(json.loads(json.dumps(record)), fn=object())
    assert kernel.hash == record["hash"]
    assert kernel.metadata.num_warps == 4 and kernel.name == "kiln_kernel0"
    assert kernel.src.signature == {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"}
    assert dict(kernel.src.constants) == {(3,): 1024}
    assert kernel.src.attrs[(0,)] == [["tt.divisibility", 16]]
    assert kernel.asm["cubin"][:4] == b"\x7fELF"


def test_a_corrupt_binary_or_record_is_refused(tmp_path, monkeypatch):
    reply, tcache = _worker_build(tmp_path)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tcache))
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path / "kiln"))
    record = reply["record"]
    key = "ab" * 32
    triton_binary.save(key, record)
    cubin = tcache / next(p for f, p in record["files"].items() if f.endswith(".cubin"))
    data = cubin.read_bytes()
    cubin.write_bytes(data[:100])  # a torn write
    with pytest.raises(triton_record.RecordError, match="digest"):
        triton_binary.construct(record, fn=object())
    assert triton_binary.load(key, object(), 0, "k") is None  # the JIT path decides
    cubin.write_bytes(data)
    path = triton_binary._path(key)
    with open(path, "r+b") as f:
        f.truncate(20)
    assert triton_binary.load(key, object(), 0, "k") is None and not os.path.exists(path)


def test_the_worker_predicted_key_is_the_launch_key():
    """The build worker's record is saved under the key the parent's first launch computes
    from its real arguments: aligned tensors of the predicted dtypes and the same integers."""
    x, y = torch.empty(4096), torch.empty(4096)
    runtime = triton_binary.runtime_facts([x, y, 4096])
    assert runtime == triton_binary.predicted_facts(REQ_ARGS)
    k1 = triton_binary.record_key("m", "kiln_kernel0", runtime, dict(KWARGS), "cuda:90")
    k2 = triton_binary.record_key("m", "kiln_kernel0", triton_binary.predicted_facts(REQ_ARGS), KWARGS,
                                  triton_binary.arch_of_target(["cuda", 90, 32]))
    assert k1 == k2


def test_keys_separate_everything_that_decides_the_binary(monkeypatch):
    x = torch.empty(4097)
    base = dict(module="m", name="k", facts=triton_binary.runtime_facts([x, x, 4096]), kwargs=KWARGS, arch="cuda:90")

    def key(**kw):
        d = dict(base, **kw)
        return triton_binary.record_key(d["module"], d["name"], d["facts"], d["kwargs"], d["arch"])
    variants = [
        key(),
        key(facts=triton_binary.runtime_facts([x[1:], x, 4096])),         # an unaligned pointer
        key(facts=triton_binary.runtime_facts([x.half(), x, 4096])),      # another dtype
        key(facts=triton_binary.runtime_facts([x, x, 4095])),             # not divisible by 16
        key(facts=triton_binary.runtime_facts([x, x, 1])),                # the value 1
        key(facts=triton_binary.runtime_facts([x, x, 2 ** 33])),          # past 32 bits
        key(kwargs=dict(KWARGS, XBLOCK=512)),
        key(kwargs=dict(KWARGS, num_warps=8)),
        key(arch="cuda:80"),
        key(module="m2"),
        key(name="k2"),
    ]
    assert len(set(variants)) == len(variants)
    monkeypatch.setenv("TRITON_DEBUG", "1")  # Triton's own cache key reads its environment
    monkeypatch.setattr(triton_binary, "_stamp", [])  # read once per process
    assert key() != variants[0]
    assert triton_binary.runtime_facts([object()]) is None


def test_encoding_round_trips_the_source_fields():
    import enum

    class Lang(enum.Enum):
        A = 1
    fields = {"signature": {"a": "*fp32", "b": ("i32", "i64")}, "constants": {(3,): 1024, (4, 0): None},
              "attrs": {(0,): [["tt.divisibility", 16]]}, "n": 1.5, "flag": True}
    assert triton_record.decode(json.loads(json.dumps(triton_record.encode(fields)))) == fields
    with pytest.raises(triton_record.RecordError):
        triton_record.encode({"x": object()})
    assert triton_record.encode(Lang.A)["e"][1:] == ["test_encoding_round_trips_the_source_fields.<locals>.Lang", "A"]


# ------------------------------------------------------------------ the launcher's record path
class _Kernel:
    def __init__(self, log, tag):
        self.log, self.tag = log, tag
        self.function, self.packed_metadata = tag, "meta"

    def run(self, *args):
        self.log.append((self.tag, args))


def kiln_kernel7():  # stands for the @triton.jit function's Python function
    pass


class _Jit:
    arg_names = ["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"]
    fn = kiln_kernel7

    def __init__(self):
        self.log = []
        self.kernel = _Kernel(self.log, "jit-kernel")

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid))
            return self.kernel
        return launch


@pytest.fixture
def records(monkeypatch):
    """triton_binary's load and save, recorded: {key: kernel} serves loads."""
    store, saved = {}, []
    monkeypatch.setattr(triton_binary, "load", lambda key, fn, device, what: store.get(key))
    monkeypatch.setattr(triton_binary, "save_from_kernel", lambda key, kernel, what: saved.append(key))
    monkeypatch.setattr(triton_binary, "arch_of", lambda device: "cuda:90")
    return store, saved


def _launcher(jit):
    return FastLauncher(jit, "k", get_device=lambda: 0, get_stream=lambda d: 77, hooks=lambda: ())


def test_a_first_launch_with_a_record_skips_the_jit(records):
    store, saved = records
    jit = _Jit()
    x, y = torch.empty(64), torch.empty(64)
    key = triton_binary.record_key(__name__, "kiln_kernel7", triton_binary.runtime_facts([x, y, 64]),
                                   {"XBLOCK": 64, "num_warps": 1}, "cuda:90")
    store[key] = _Kernel(jit.log, "recorded")
    lau = _launcher(jit)
    lau[(1,)](x, y, 64, XBLOCK=64, num_warps=1)
    lau[(1,)](x, y, 64, XBLOCK=64, num_warps=1)
    assert [e[0] for e in jit.log] == ["recorded", "recorded"] and not saved
    assert jit.log[0][1] == (1, 1, 1, 77, "recorded", "meta", None, None, None, x, y, 64, 64)


def test_a_first_launch_without_a_record_goes_through_the_jit_and_saves_one(records):
    store, saved = records
    jit = _Jit()
    x, y = torch.empty(64), torch.empty(64)
    lau = _launcher(jit)
    lau[(1,)](x, y, 64, XBLOCK=64, num_warps=1)
    lau[(1,)](x, y, 64, XBLOCK=64, num_warps=1)
    assert [e[0] for e in jit.log] == ["jit", "jit-kernel"]
    assert saved == [triton_binary.record_key(__name__, "kiln_kernel7", triton_binary.runtime_facts([x, y, 64]),
                                              {"XBLOCK": 64, "num_warps": 1}, "cuda:90")]
    assert kiln.stats()["triton_jit_launches"] == 1


def test_a_bound_grid_with_new_specialization_launches_the_new_record(records):
    """The grid keeps its first binding; an argument that specializes differently launches the
    kernel recorded for it, never the bound one."""
    store, saved = records
    jit = _Jit()
    x = torch.empty(65)
    lau = _launcher(jit)
    lau[(1,)](x, x, 64, XBLOCK=64, num_warps=1)   # JIT, bound
    unaligned = x[1:]
    key = triton_binary.record_key(__name__, "kiln_kernel7", triton_binary.runtime_facts([unaligned, x, 64]),
                                   {"XBLOCK": 64, "num_warps": 1}, "cuda:90")
    store[key] = _Kernel(jit.log, "unaligned-kernel")
    lau[(1,)](unaligned, x, 64, XBLOCK=64, num_warps=1)
    assert [e[0] for e in jit.log] == ["jit", "unaligned-kernel"]
    lau[(1,)](x, x, 64, XBLOCK=64, num_warps=1)   # the bound kernel again
    assert jit.log[-1][0] == "jit-kernel"


def test_records_can_be_switched_off(records, monkeypatch):
    store, saved = records
    monkeypatch.setattr(kiln.config, "triton_binary_records", False)
    jit = _Jit()
    x = torch.empty(64)
    _launcher(jit)[(1,)](x, x, 64, XBLOCK=64, num_warps=1)
    assert [e[0] for e in jit.log] == ["jit"] and not saved


# ------------------------------------------------------------------ on a GPU
SCRIPT = textwrap.dedent("""
    import json, torch, kiln
    def f(x, y):
        return torch.relu(x) * y - x.sum(1, keepdim=True)
    torch.manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 96, device="cuda", dtype=dt)
        y = torch.randn(96, 64, device="cuda", dtype=dt).t()  # non-contiguous
        out = kiln.compile(f)(x, y)
        # the fused kernel rounds once where eager rounds the row sum (about 10 in size: a bf16
        # ulp of 0.0625) before subtracting it; 2e-2 failed on one element in 6144
        tol = dict(rtol=1e-5, atol=1e-5) if dt == torch.float32 else dict(rtol=2e-2, atol=7e-2)
        torch.testing.assert_close(out, f(x, y), **tol)
    print(json.dumps(kiln.stats()))
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="loading a binary needs a GPU")
def test_a_second_process_launches_from_records_without_the_jit(tmp_path):
    from kiln.runtime.graph_cache import kiln_source_digest
    # both processes agree on kiln's source digest (the graph key) whatever happens to the tree
    # meanwhile; the pool stays small (under pytest -n 16 every process would start 16 workers);
    # the second run's log says which kernel went through the JIT and why, should one
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(tmp_path), KILN_COMPILE_THREADS="4",
                          _KILN_TEST_SOURCE_DIGEST=kiln_source_digest(), KILN_LOGS="kernels,cache"), graph_cache=True)
    env.pop("TRITON_CACHE_DIR", None)

    def run():
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
    first, _ = run()
    assert first["triton_jit_launches"] + first["triton_binary_loads"] >= 2
    second, log = run()
    assert second["triton_jit_launches"] == 0, (second, log[-4000:])
    assert second["triton_binary_loads"] >= 2


def test_a_cached_graph_shares_binaries_as_its_cold_compile_did(monkeypatch):
    """Kernels equal up to names but launched differently keep apart on a graph-cache hit as
    they did when compiled (their recorded launch requests decide), so each finds its own
    binary record instead of the JIT."""
    from kiln import pipeline
    from kiln.runtime import builder
    from kiln.runtime.graph_cache import CachedKernel
    src = "def kiln_kernel{0}(in_ptr0, xnumel, XBLOCK: tl.constexpr):\n    pass\n"
    launch = [{"name": f"kiln_kernel{i}", "args": [["ptr", "float32", 16], ["int", n]], "kwargs": {"XBLOCK": 64}}
              for i, n in ((0, 64), (1, 4096))]
    kernels = [CachedKernel("TritonKernel", f"kiln_kernel{i}", src.format(i), ["in_ptr0"], launch=launch[i])
               for i in range(2)]
    seen = {}

    def load_kernels(ks, target, launches, reps):
        seen["reps"], seen["launches"] = reps, launches
        return [lambda *a: None for _ in ks]
    monkeypatch.setattr(builder, "load_kernels", load_kernels)

    class Hit:
        source, size_args, externs = "def call():\n    return ()\n", [], []
    pipeline.build(Hit, {k.name: k for k in kernels}, "triton")
    assert seen["reps"][0] is kernels[0] and seen["reps"][1] is kernels[1]
    assert seen["launches"] == {}  # a hit builds nothing ahead of time
    cold = builder.representatives(kernels, {k.name: k.launch for k in kernels})
    assert cold == seen["reps"]
