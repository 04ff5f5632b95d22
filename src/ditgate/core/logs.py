"""Library logs go to stderr, so that a command's stdout holds only its output (`--json | jq` works), at the level
the command's -q / -v asks for; ditgate's own progress lines go to stderr unless it is quiet.

cache-dit logs through a handler it creates on sys.stdout when it is imported; `library_logs_to_stderr` points every
logging handler that writes to stdout at stderr instead. Call it after the libraries are imported (the runner, each
worker rank and the CLI do).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings


def library_logs_to_stderr() -> int:
    """Move every stream handler writing to stdout onto stderr and set the libraries' loggers to the verbosity's
    level; returns how many handlers were moved."""
    outs = {id(s) for s in (sys.stdout, sys.__stdout__) if s is not None}
    loggers = [logging.getLogger()] + [l for l in logging.Logger.manager.loggerDict.values()
                                       if isinstance(l, logging.Logger)]
    moved = 0
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(getattr(handler, "stream", None)) in outs:
                handler.setStream(sys.stderr)
                moved += 1
    quiet_libraries()
    return moved


# How much a command says: -1 (-q) nothing on success, 0 its output and progress, 1 (-v) library warnings too,
# 2 (-vv) library info lines too. Set once by the CLI (`set_verbosity`); forked and torchrun ranks inherit it
# through the environment.
VERBOSITY_ENV = "DITGATE_VERBOSITY"
LIBRARIES = ("transformers", "diffusers", "cache_dit", "accelerate", "huggingface_hub", "torch")
# The level of library log records shown at each verbosity (-q and the default: errors only).
LIBRARY_LEVEL = {-1: logging.ERROR, 0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}


def verbosity() -> int:
    try:
        return max(-1, min(2, int(os.environ.get(VERBOSITY_ENV, "0"))))
    except ValueError:
        return 0


def set_verbosity(level: int) -> None:
    """Route library messages by level for this process and the ranks it starts: transformers', diffusers' and
    cache-dit's loggers (through their environment variables before they are imported, and their loggers if they
    already are) and Python warnings (shown from -v on)."""
    level = max(-1, min(2, level))
    os.environ[VERBOSITY_ENV] = str(level)
    threshold = LIBRARY_LEVEL[level]
    name = logging.getLevelName(threshold)
    os.environ["TRANSFORMERS_VERBOSITY"] = name.lower()
    os.environ["DIFFUSERS_VERBOSITY"] = name.lower()
    os.environ["CACHE_DIT_LOG_LEVEL"] = name.lower()
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1" if level < 1 else ""
    if level < 1:
        os.environ["PYTHONWARNINGS"] = "ignore"
        warnings.simplefilter("ignore")
    else:
        os.environ.pop("PYTHONWARNINGS", None)
        warnings.simplefilter("default")
    if level < 1:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    else:
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    quiet_libraries(threshold)


def quiet_libraries(threshold: int | None = None) -> None:
    """Set every library logger already created to the verbosity's threshold (a logger created later reads the
    environment) and, below -v, turn the libraries' progress bars off. Call again after importing a library that
    sets its loggers' levels at import (cache-dit does)."""
    threshold = LIBRARY_LEVEL[verbosity()] if threshold is None else threshold
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != threshold and name.split(".")[0] in LIBRARIES:
            logger.setLevel(threshold)  # each call clears every logger's cache: only where the level changes
    bars = verbosity() >= 1
    for module in ("transformers.utils.logging", "diffusers.utils.logging"):
        if module in sys.modules:
            getattr(sys.modules[module], "enable_progress_bar" if bars else "disable_progress_bar")()
    if "huggingface_hub.utils" in sys.modules:
        hub = sys.modules["huggingface_hub.utils"]
        with warnings.catch_warnings():  # the hub refuses to enable bars its environment variable turned off
            warnings.simplefilter("ignore")
            (hub.enable_progress_bars if bars else hub.disable_progress_bars)()


def quiet_pipeline(pipe):
    """The pipeline, its denoising progress bar off below -v (ditgate's own progress says where a run is)."""
    if verbosity() < 1 and hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    return pipe


def progress(line: str) -> None:
    """A progress line on stderr, unless the command is quiet (-q)."""
    if verbosity() >= 0:
        print(line, file=sys.stderr, flush=True)
