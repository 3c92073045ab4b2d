"""python -m kiln {demo, explain, report, bench, config}"""
from __future__ import annotations

import sys

USAGE = """usage: python -m kiln COMMAND [ARGS]

commands:
  demo     compile the seed example and print every stage, then time it
  explain  run a script with compilation observed and print the explain summary
  report   turn a KILN_DEBUG dump into one HTML page (--profile script.py: time it first)
  bench    run the benchmark suite (python -m benchmarks.run)
  config   print every setting, its value and where the value came from
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from kiln.observe.demo import main as demo
        return demo(rest)
    if cmd == "explain":
        from kiln.observe.explain_script import main as explain
        return explain(rest)
    if cmd == "report":
        from kiln.observe.report import main as report
        return report(rest)
    if cmd == "config":
        from kiln.config import main as config_main
        return config_main(rest)
    if cmd == "bench":
        from benchmarks.run import main as bench
        return bench(rest)
    print(f"python -m kiln: command {cmd!r} is not available yet\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
