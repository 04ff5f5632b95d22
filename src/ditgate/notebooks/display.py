"""What an executed notebook shows, so that an engineer reads it top to bottom: a PASS/FAIL banner, a table of
every gate (threshold, value, margin), the run's table once, where a failed exact row departs from its baseline,
the pictures, and the run's log folded away.

While a notebook cell works (`captured`), everything the libraries and the ranks say goes to a log file instead of
red stderr cells: Python's stdout and stderr (progress bars, warnings, ditgate's progress lines), the logging
handlers that hold the kernel's streams, and file descriptors 1 and 2 (what forked ranks and C++ code write). The
log is shown folded (`<details>`) under the results, with its path.
"""

from __future__ import annotations

import contextlib
import html
import io
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from ditgate.gates.verdicts import format_value

LOG_TAIL_LINES = 400  # lines of the log shown folded in the notebook (the file has them all)
_PICTURE_LINE = re.compile(r"^!\[[^\]]*\]\([^)]*\)\s*$", re.MULTILINE)


def strip_pictures(markdown: str) -> str:
    """Markdown without its picture lines (the notebook displays the pictures themselves)."""
    return _PICTURE_LINE.sub("", markdown)


@contextlib.contextmanager
def captured(log_path: Path) -> Iterator[io.TextIOBase]:
    """Send stdout, stderr, the loggers' stream handlers and file descriptors 1 and 2 to `log_path` (appended) for
    the block; yields the log file (write ditgate's progress lines to it)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    with open(log_path, "a", buffering=1, encoding="utf-8", errors="replace") as log:
        for stream in streams:
            _flush(stream)
        saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
        handlers = [h for h in _stream_handlers() if any(h.stream is s for s in streams if s is not None)]
        previous = [h.setStream(log) for h in handlers]
        try:
            for fd in saved_fds:
                os.dup2(log.fileno(), fd)
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield log
        finally:
            log.flush()
            for fd, copy in saved_fds.items():
                os.dup2(copy, fd)
                os.close(copy)
            for handler, stream in zip(handlers, previous):
                handler.setStream(stream)


def _flush(stream) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):
        pass


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [l for l in logging.Logger.manager.loggerDict.values()
                                       if isinstance(l, logging.Logger)]
    return [h for l in loggers for h in l.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


# ------------------------------------------------------------------------------------------------ the verdict


def banner(passed: bool, title: str, reasons: list[str]) -> str:
    """HTML: a green PASS or red FAIL banner with the reasons."""
    colour, word = ("#1a7f37", "PASS") if passed else ("#cf222e", "FAIL")
    items = "".join(f"<li>{html.escape(r)}</li>" for r in reasons)
    return (f'<div style="border-left:8px solid {colour};padding:6px 12px;margin:4px 0;background:{colour}14">'
            f'<span style="font-size:1.6em;font-weight:bold;color:{colour}">{word}</span> '
            f'<span style="font-size:1.1em">{html.escape(title)}</span>'
            + (f"<ul style='margin:4px 0'>{items}</ul>" if items else "") + "</div>")


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def margin(op: str, value: float | None, threshold: float) -> float | None:
    """How far the value is inside its threshold (negative: how far outside); None when there is no value."""
    if value is None or value != value:
        return None
    if op in (">", ">="):
        return value - threshold
    if op in ("<", "<="):
        return threshold - value
    return -abs(value - threshold)


def gate_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: every check of every gated row, with its threshold, value and margin; "" when no row has checks."""
    lines = ["| row | check | threshold | value | margin | |", "|---|---|---|---|---|---|"]
    for row in rows:
        for check in (row.get("verdict") or {}).get("checks") or []:
            metric, op = check["metric"], check["op"]
            threshold, value = float(check["threshold"]), _number(check.get("value"))
            room = margin(op, value, threshold)
            shown = "–" if room is None else ("+" if room >= 0 else "−") + format_value(metric, abs(room))
            lines.append(f"| {row['name']} | {metric} | {op} {format_value(metric, threshold, threshold=True)} | "
                         f"{format_value(metric, value)} | {shown} | {'pass' if check['passed'] else '**FAIL**'} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


# ------------------------------------------------------------------------------------------------- showing


def folded_log(path: Path) -> str:
    """HTML: the log's last lines, folded, with the file's path."""
    path = Path(path)
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    shown = lines[-LOG_TAIL_LINES:]
    cut = f", the last {len(shown)} shown" if len(shown) < len(lines) else ""
    return (f"<details><summary>log: {len(lines)} lines{cut} (library messages, progress bars, ranks) — "
            f"<code>{html.escape(str(path))}</code></summary><pre style='font-size:0.8em'>"
            f"{html.escape(chr(10).join(shown))}</pre></details>")


def show_diff(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Where each failed exact row first departs from its baseline (`ditgate diff`'s report and picture)."""
    from IPython.display import Image, Markdown, display

    for row in rows:
        diff = row.get("diff") or {}
        folder = Path(diff["folder"]) if diff.get("folder") else None
        if diff.get("error"):
            display(Markdown(f"### {row['name']}: the diff could not run\n\n{diff['error']}"))
        if folder is None or not (folder / "diff.md").is_file():
            continue
        display(Markdown(f"### Where {row['name']} departs from its baseline\n\n"
                         + strip_pictures((folder / "diff.md").read_text())))
        if (folder / "diff.png").is_file():
            display(Image(filename=str(folder / "diff.png")))
