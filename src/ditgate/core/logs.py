"""Library logs go to stderr, so that a command's stdout holds only its output (`--json | jq` works).

cache-dit logs through a handler it creates on sys.stdout when it is imported; `library_logs_to_stderr` points every
logging handler that writes to stdout at stderr instead. Call it after the libraries are imported (the runner, each
worker rank and the CLI do).
"""

from __future__ import annotations

import logging
import sys


def library_logs_to_stderr() -> int:
    """Move every stream handler writing to stdout onto stderr; returns how many were moved."""
    outs = {id(s) for s in (sys.stdout, sys.__stdout__) if s is not None}
    loggers = [logging.getLogger()] + [l for l in logging.Logger.manager.loggerDict.values()
                                       if isinstance(l, logging.Logger)]
    moved = 0
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(getattr(handler, "stream", None)) in outs:
                handler.setStream(sys.stderr)
                moved += 1
    return moved
