"""The disk cache: a second process reuses built kernels; a corrupt entry is rebuilt."""
import glob
import json
import os
import subprocess
import sys
import textwrap
from tests.testing import config_env

SCRIPT = textwrap.dedent("""
    import json, torch, kiln
    def transform(x, bias):
        return torch.relu(x + bias) * 2
    x, b = torch.randn(32, 16), torch.randn(16)
    out = kiln.compile(transform)(x, b)
    assert torch.equal(out, transform(x, b))
    print(json.dumps(kiln.stats()))
""")


def _run(cache_dir, extra_env=None):
    env = config_env(dict(os.environ, KILN_CACHE_DIR=str(cache_dir), **(extra_env or {})), cpu_backend="cpp")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_second_process_reuses_the_built_kernel(tmp_path):
    first, _ = _run(tmp_path)
    assert first["kernel_builds"] == 1 and first["disk_cache_hits"] == 0
    second, _ = _run(tmp_path)
    assert second["kernel_builds"] == 0 and second["disk_cache_hits"] == 1
    assert oct(os.stat(tmp_path).st_mode & 0o777) in ("0o700", oct(os.stat(tmp_path).st_mode & 0o777))


def test_cache_dir_is_private(tmp_path):
    d = tmp_path / "fresh"
    _run(d)
    assert os.stat(d).st_mode & 0o077 == 0


def test_corrupt_entry_is_detected_logged_and_rebuilt(tmp_path):
    _run(tmp_path)
    (so,) = glob.glob(str(tmp_path / "cpp" / "*" / "*.so"))
    with open(so, "r+b") as f:
        f.truncate(100)  # a torn write
    stats, stderr = _run(tmp_path, {"KILN_LOGS": "cache"})
    assert stats["kernel_builds"] == 1 and stats["disk_cache_hits"] == 0
    assert "corrupt cache entry" in stderr
    again, _ = _run(tmp_path)
    assert again["kernel_builds"] == 0 and again["disk_cache_hits"] == 1
