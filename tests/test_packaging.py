"""Packaging and the command line: the ``kiln`` console script and its argparse subcommands,
``kiln.__version__`` from one place, LICENSE and py.typed shipped, type hints on the public
API, dependencies declared exactly as imported, and ``kiln bench`` outside a checkout."""
import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
import typing

import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN_DIR = os.path.join(ROOT, "kiln")


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _kiln(*args, cwd=ROOT, pythonpath=ROOT):
    # the given kiln first, then whatever the suite's own path held (the device installs the
    # bytecode package into a --target directory named only there); never the checkout itself,
    # which would make a copy of kiln outside it see the checkout's benchmarks
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p and os.path.abspath(p) != ROOT]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pythonpath, *inherited]))
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_version_flag_and_attribute_match_pyproject():
    proc = _kiln("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"kiln {kiln.__version__}"
    setuptools = pytest.importorskip("setuptools.config.pyprojecttoml")
    # the version a build would write, with pyproject's dynamic field resolved
    conf = setuptools.read_configuration(os.path.join(ROOT, "pyproject.toml"), expand=True)
    assert conf["project"]["version"] == kiln.__version__
    assert "version" in _pyproject()["project"]["dynamic"]  # written once: kiln/_version.py


def test_report_o_without_a_value_is_a_usage_error():
    proc = _kiln("report", "-o")  # was an IndexError traceback
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "usage:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _main(capsys, *args):
    """kiln's main in this process: (exit status, stdout, stderr); any exception but argparse's
    SystemExit propagates, failing the test as a traceback would."""
    from kiln.__main__ import main
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args", [("report",), ("report", "--profile"), ("report", "--trace"),
                                  ("explain",), ("demo", "--size"), ("demo", "--size", "x"),
                                  ("no-such-command",), ("--no-such-flag",)])
def test_bad_arguments_are_usage_errors(capsys, args):
    code, _, err = _main(capsys, *args)
    assert code == 2 and "usage:" in err, err


def test_each_subcommand_has_its_own_help(capsys):
    for cmd, words in [("report", "--profile"), ("explain", "SCRIPT.py"), ("demo", "--size"),
                       ("bench", "--cases")]:
        code, out, err = _main(capsys, cmd, "--help")
        assert code == 0 and words in out, (cmd, out, err)
    code, out, _ = _main(capsys, "--help")
    assert code == 0 and all(c in out for c in ("demo", "explain", "report", "bench"))


def test_console_script_entry_point():
    scripts = _pyproject()["project"]["scripts"]
    assert scripts == {"kiln": "kiln.__main__:main"}
    from kiln.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0


def test_license_and_py_typed_are_shipped():
    conf = _pyproject()
    assert os.path.exists(os.path.join(ROOT, "LICENSE"))
    assert conf["project"]["license-files"] == ["LICENSE"]
    assert os.path.exists(os.path.join(KILN_DIR, "py.typed"))
    assert "py.typed" in conf["tool"]["setuptools"]["package-data"]["kiln"]


def test_public_api_is_annotated():
    import inspect
    for fn in (kiln.compile, kiln.explain, kiln.stats, kiln.is_compiling, kiln.reset,
               kiln.disable, kiln.graph_break, kiln.mark_dynamic):
        hints = typing.get_type_hints(fn)  # resolvable, not just strings
        assert "return" in hints, fn.__name__
        assert set(inspect.signature(fn).parameters) <= set(hints), fn.__name__
    assert set(typing.get_type_hints(kiln.compile)) >= {"model", "fullgraph", "dynamic", "mode", "options"}


def _imported_top_level_modules() -> set:
    names = set()
    for dirpath, _, files in os.walk(KILN_DIR):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f)) as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        names.update(a.name.split(".")[0] for a in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names.add(node.module.split(".")[0])
    return names


def _dist_module(requirement: str) -> str:
    name = requirement
    for sep in "<>=!~[; ":
        name = name.split(sep)[0]
    return name.strip().lower().replace("-", "_")


def test_every_dependency_is_imported_and_every_import_is_declared():
    conf = _pyproject()["project"]
    imported = _imported_top_level_modules()
    required = {_dist_module(r) for r in conf["dependencies"]}
    assert required <= imported, f"declared but never imported by kiln/: {sorted(required - imported)}"
    optional = {_dist_module(r) for rs in conf["optional-dependencies"].values() for r in rs}
    # benchmarks: the repository's runner, which `kiln bench` imports from a checkout only
    third_party = imported - set(sys.stdlib_module_names) - {"kiln", "__future__", "benchmarks"}
    # an import that no requirement names is a missing declaration (the optional ones, triton,
    # are imported behind a try)
    undeclared = third_party - required - optional
    assert not undeclared, f"imported by kiln/ but not declared: {sorted(undeclared)}"


def test_bench_outside_a_checkout_is_a_one_line_error(tmp_path):
    # kiln as a wheel installs it: the package alone, no benchmarks/ beside it
    shutil.copytree(KILN_DIR, tmp_path / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
    proc = _kiln("bench", "--quick", cwd=tmp_path, pythonpath=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "checkout" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    # in the checkout, it is the benchmark runner, and a run exits 0 (its records are not the
    # exit status)
    proc = _kiln("bench", "--device", "cpu", "--quick", "--cases", "overhead_4args", "--no-torch-compile")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rec["case"] == "overhead_4args" and rec["correct"] and rec["kiln_version"] == kiln.__version__
