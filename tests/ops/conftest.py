"""Op-table summary: after a run that includes tests/ops/test_optable*.py, print per way how
many entries passed, were expected failures, failed or were skipped."""
import collections
import re

_COUNTS = collections.defaultdict(collections.Counter)
_ID = re.compile(r"test_optable(?:_grad)?\.py::test_(?:op|grad_matches_eager)\[(?P<entry>\w+)-(?P<way>\w+)\]$")


def pytest_runtest_logreport(report):
    m = _ID.search(report.nodeid)
    if m is None or (report.when != "call" and not (report.when == "setup" and report.outcome != "passed")):
        return
    way = m["way"] if "_grad.py" not in report.nodeid else f"grad_{m['way']}"
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    else:
        outcome = report.outcome
    _COUNTS[way][outcome] += 1


def pytest_terminal_summary(terminalreporter):
    if not _COUNTS:
        return
    tr = terminalreporter
    cols = ["passed", "xfailed", "failed", "xpassed", "skipped"]
    tr.write_sep("=", "op table: entries per way")
    tr.write_line(f"{'way':<22}" + "".join(f"{c:>9}" for c in cols))
    for way, counts in sorted(_COUNTS.items()):
        tr.write_line(f"{way:<22}" + "".join(f"{counts[c]:>9}" for c in cols))
