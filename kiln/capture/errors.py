"""Unsupported: what capture raises for anything it does not handle (a graph break)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class FrameState:
    """Where one frame of the interpreter stood when capture stopped.

    A later step generates resume functions from this: the instruction index to restart at,
    the live stack (value trackers, bottom first) and the locals.
    """
    code: object
    instruction_index: int
    offset: int
    lineno: int | None
    stack: list
    locals: dict


class Unsupported(Exception):
    """Capture cannot handle this step; the caller runs the function eagerly (for now).

    ``reason`` says what; ``filename``/``lineno``/``source_line`` say where (the innermost
    user frame); ``frames`` holds the interpreter state of every frame, outermost first.
    """

    def __init__(self, reason: str, filename: str | None = None, lineno: int | None = None,
                 source_line: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.filename = filename
        self.lineno = lineno
        self.source_line = source_line
        self.frames: list[FrameState] = []

    @property
    def located(self) -> bool:
        return self.filename is not None

    def locate(self, filename, lineno, source_line):
        if not self.located:
            self.filename, self.lineno, self.source_line = filename, lineno, source_line

    def __str__(self):
        where = f" at {self.filename}:{self.lineno}: {self.source_line}" if self.located else ""
        return f"{self.reason} (graph break){where}"


class EagerRaises(Unsupported):
    """A step capture knows eager refuses (``float()`` of a tensor with two elements, an
    in-place write eager rejects): a graph break like any other, except under
    ``fullgraph=True``, where the call runs eagerly so the user gets eager's own exception
    from their line, as for an op whose meta refused its arguments (``api._at_graph_break``)."""


def eager_rejects(e: Unsupported) -> bool:
    """Does eager raise at the step where capture stopped? An ``EagerRaises``, or an op whose
    meta rule or argument check raised (the break's ``__cause__``)."""
    return isinstance(e, EagerRaises) or (e.__cause__ is not None
                                          and not isinstance(e.__cause__, Unsupported))
