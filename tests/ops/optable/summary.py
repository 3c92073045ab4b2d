"""Run the op table and print how many entries pass, xfail and fail per way:

    python -m tests.ops.optable.summary [pytest args, e.g. -n 2 or -k elementwise]

The counting lives in tests/ops/conftest.py (a terminal-summary hook), so any pytest run that
includes tests/ops/test_optable.py prints the same table.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = os.path.dirname(HERE)

if __name__ == "__main__":
    args = [os.path.join(OPS, "test_optable.py"), os.path.join(OPS, "test_optable_grad.py"),
            "-p", "no:cacheprovider", *sys.argv[1:]]
    sys.exit(pytest.main(args))
