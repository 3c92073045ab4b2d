"""kiln.config: KILN_CONFIG parsing (in a fresh process, since settings are read at import),
the public variables, patch scopes, sources, and ``python -m kiln config``."""
import glob
import os
import re
import subprocess
import sys

import pytest

import kiln
from kiln.config import PUBLIC_ENV, RETIRED_ENV, Config, ConfigError
from kiln.runtime import pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, **env):
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in list(full):
        if k.startswith("KILN_") and k not in ("KILN_CACHE_DIR",):
            del full[k]
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=ROOT,
                          timeout=120)


def test_kiln_config_sets_settings_by_type_in_a_fresh_process():
    code = ("import kiln; c = kiln.config; print(repr((c.triton_tile_2d, c.triton_looped_rblock, "
            "c.speculative_backward, c.compile_threads, c.pad_gemm_min_intensity, c.cpu_backend, c.strict, "
            "c.source('triton_tile_2d'), c.source('strict'), c.source('verify'), c.source('reuse_buffers'))))")
    proc = _python(code, KILN_CONFIG="triton_tile_2d=0, triton_looped_rblock=2048,speculative_backward=on,"
                   "compile_threads=auto,pad_gemm_min_intensity=12.5,cpu_backend=cpp,strict=yes",
                   KILN_VERIFY="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr((False, 2048, True, None, 12.5, "cpp", True,
                                        "KILN_CONFIG", "KILN_CONFIG", "KILN_VERIFY", "default"))


def test_kiln_config_wins_over_a_public_variable_and_later_entries_win():
    proc = _python("import kiln; print(kiln.config.compile_threads, kiln.config.source('compile_threads'), "
                   "kiln.config.worker_nice)",
                   KILN_COMPILE_THREADS="2", KILN_CONFIG="compile_threads=5,worker_nice=3,worker_nice=4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5", "KILN_CONFIG", "4"]


@pytest.mark.parametrize("spec, message", [
    ("triton_tile2d=0", r"unknown setting 'triton_tile2d'; known settings: aot_launchers, .*triton_tile_2d"),
    ("triton_looped_rblock=big", r"triton_looped_rblock='big' is not a valid int"),
    ("triton_tile_2d=maybe", r"triton_tile_2d='maybe' is not a valid bool"),
    ("triton_tile_2d", r"'triton_tile_2d' is not name=value"),
])
def test_a_bad_kiln_config_entry_is_an_error_naming_it(spec, message):
    proc = _python("import kiln", KILN_CONFIG=spec)
    assert proc.returncode != 0
    assert "ConfigError" in proc.stderr and re.search(message, proc.stderr), proc.stderr


def test_load_environment_parses_in_process():
    c = Config()
    c.load_environment({"KILN_CONFIG": "graph_cache=off,cpp_flags=-O2 -fopenmp", "KILN_BUILD_TIMEOUT": "7"})
    assert (c.graph_cache, c.cpp_flags, c.build_timeout) == (False, ("-O2", "-fopenmp"), 7.0)
    assert (c.source("graph_cache"), c.source("build_timeout"), c.source("cache_dir")) == \
        ("KILN_CONFIG", "KILN_BUILD_TIMEOUT", "default")
    with pytest.raises(ConfigError, match="known settings"):
        Config().load_environment({"KILN_CONFIG": "nope=1"})


def test_a_retired_variable_warns_with_its_setting():
    with pytest.warns(UserWarning, match="KILN_TILE_2D is no longer read; set KILN_CONFIG=triton_tile_2d=0"):
        Config().load_environment({"KILN_TILE_2D": "0"})


def test_patch_sets_for_a_scope_and_restores_value_and_source():
    before = (kiln.config.triton_tile_2d, kiln.config.source("triton_tile_2d"))
    with kiln.config.patch(triton_tile_2d=not before[0]):
        assert kiln.config.triton_tile_2d is (not before[0])
        assert kiln.config.source("triton_tile_2d") == "patch"
    assert (kiln.config.triton_tile_2d, kiln.config.source("triton_tile_2d")) == before
    with pytest.raises(AttributeError, match="no setting"):
        with kiln.config.patch(triton_tile2d=False):
            pass


def test_setting_an_unknown_name_is_an_error():
    c = Config()
    with pytest.raises(AttributeError, match="no setting 'tile_2d'"):
        c.tile_2d = False
    c.cpp_tile_2d = False
    assert c.source("cpp_tile_2d") == "set in code"


def test_workers_get_the_worker_settings_of_the_parent():
    """Build workers import no kiln: pool passes them config's worker settings, patches too."""
    with kiln.config.patch(worker_nice=3, aot_launchers=False, worker_torch=True):
        env = pool._worker_env()
    assert (env["_KILN_WORKER_NICE"], env["_KILN_AOT_LAUNCHERS"], env["_KILN_WORKER_TORCH"]) == ("3", "0", "1")


def test_python_m_kiln_config_prints_every_setting_value_and_source():
    env = dict(os.environ, KILN_CONFIG="triton_tile_2d=0", KILN_STRICT="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "kiln", "config"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    assert set(rows) == {f for f in kiln.config.__dataclass_fields__}
    assert rows["triton_tile_2d"][1:3] == ["False", "KILN_CONFIG"]
    assert rows["strict"][1:3] == ["True", "KILN_STRICT"]
    assert rows["recompile_limit"][1:3] == ["8", "default"]
    assert rows["build_timeout"][1:] == ["300.0", "default", "(KILN_BUILD_TIMEOUT)"]


def test_at_most_ten_public_variables_each_in_the_readme():
    """Every KILN_* name in kiln's sources is public (or a retired one config.py warns about)."""
    public = set(PUBLIC_ENV.values()) | {"KILN_CONFIG", "KILN_LOGS"}
    assert len(public) <= 10
    not_variables = {"KILN_KERNEL", "KILN_CACHE_VERSION"}  # a source placeholder, a constant
    seen = set()
    for path in glob.glob(os.path.join(ROOT, "kiln", "**", "*.py"), recursive=True):
        if path.endswith(os.path.join("kiln", "config.py")):
            continue
        seen |= set(re.findall(r"\bKILN_[A-Z0-9_]+", open(path).read()))
    assert seen - not_variables <= public, seen - not_variables - public
    assert not set(RETIRED_ENV) & public
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert all(f"`{v}" in readme for v in public), [v for v in public if f"`{v}" not in readme]


def test_every_setting_can_be_set_from_kiln_config():
    from kiln.config import _FIELDS, _PARSERS
    assert [n for n, f in _FIELDS.items() if f.type not in _PARSERS] == []
