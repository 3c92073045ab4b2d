"""Observers of the compiler: log formatting, KILN_DEBUG dumps, explain, the report.

They sit above the stages, the driver and the api, and subscribe to them here, so none of
those imports them (docs/architecture.md, "Layers").
"""
from kiln import eager_runs, log, pipeline
from kiln.config import config
from kiln.observe import logs

log.PASS_SUBSCRIBERS.append(logs.pass_done)


@pipeline.subscribe
def _compile_seen(event, ctx, name=None, capture=None, compiled=None, entries=None, L=None, G=None,
                  **_):
    """The driver's events (``pipeline.emit``): the capture, guard and recompile logs, and the
    KILN_DEBUG dump of each compile."""
    if event == "captured":
        logs.captured(name, capture)
    elif event == "guards":
        logs.guards(name, capture)
    elif event == "recompiling":
        logs.recompile_detail(entries, L, G)
    elif event == "compiled" and config.debug:
        # debug's loop-IR printer imports the inductor: loaded only when KILN_DEBUG is on
        from kiln.observe.debug import write_dump
        write_dump(ctx, compiled)


def _eager_run_seen(record):
    if config.debug:
        # debug's loop-IR printer imports the inductor: loaded only when KILN_DEBUG is on
        from kiln.observe import debug
        debug.write_eager_runs(eager_runs.records())


eager_runs.SUBSCRIBERS.append(_eager_run_seen)
