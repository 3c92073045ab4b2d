"""Observers of the compiler: log formatting, KILN_DEBUG dumps, explain, the report.

They sit above the stages and subscribe to them here, so no stage imports them.
"""
from kiln import eager_runs, log
from kiln.config import config
from kiln.observe import logs

log.PASS_SUBSCRIBERS.append(logs.pass_done)


def _eager_run_seen(record):
    if config.debug:
        # debug's loop-IR printer imports the inductor: loaded only when KILN_DEBUG is on
        from kiln.observe import debug
        debug.write_eager_runs(eager_runs.records())


eager_runs.SUBSCRIBERS.append(_eager_run_seen)
