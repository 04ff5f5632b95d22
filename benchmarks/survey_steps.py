"""Running one `ditgate` command inside a survey worker and reading what it printed: the exit status and output
(`step`), the last error line (`last_error`) and where it was raised (`where`), a failed row's reason
(`row_reason`), the JSON `ditgate inspect --json` printed (`inspect_json`), whether a command takes an option
(`has_option`), and the seeded input image of the pipelines that need one (`test_image`). Used by
benchmarks/pipeline_survey.py and benchmarks/survey_scaffold.py.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def last_error(text: str) -> str:
    """The last line of a command's output that reads as an error (a traceback's last line, a ditgate error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^([A-Za-z_.]+(Error|Exception)|error|ditgate: error|AssertionError)\b", line) or "Error:" in line:
            if " with {" in line and "} failed: " in line:  # "running X with {the call} failed: E": X and E
                line = line.split(" with {", 1)[0] + ": " + line.split("} failed: ", 1)[1]
            return line[:300]
    return (lines[-1][:300] if lines else "no output")


def where(text: str) -> str:
    """file:line of the innermost frame of the last traceback in `text` (site-packages paths shortened)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', text)
    if not frames:
        return ""
    path, line = frames[-1]
    return f" ({re.sub(r'^.*/(site-packages|src)/', '', path)}:{line})"


STDERR_MARK = "\n--- stderr ---\n"


def has_option(command: str, option: str) -> bool:
    """Whether `ditgate COMMAND` takes `option` (read from the CLI's own parser)."""
    from ditgate.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return option in sub.choices[command]._option_string_actions


def test_image(path: Path) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64]
    img = np.stack([x * 4, y * 4, 255 - (x + y) * 2], -1).astype(np.float64)
    img[16:40, 20:44] = rng.integers(0, 255, 3)  # a block of one seeded colour
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(path)
    return path


def step(argv: list[str]) -> tuple[int, str]:
    """`ditgate ARGV` in this process: exit status and what it printed (stderr after stdout)."""
    import contextlib
    import io
    import traceback

    from ditgate.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # a traceback is a result here
            traceback.print_exc()
            rc = 1
    return rc, out.getvalue() + STDERR_MARK + err.getvalue()


def inspect_json(out: str) -> dict:
    """The object `ditgate inspect --json` printed: the last line-initial `{` that parses (progress bars and
    warnings can come before it)."""
    stdout = out.split(STDERR_MARK, 1)[0]
    decoder = json.JSONDecoder()
    for match in reversed(list(re.finditer(r"(?m)^\{", stdout))):
        try:
            found, _ = decoder.raw_decode(stdout, match.start())
        except ValueError:
            continue
        if isinstance(found, dict) and "cache_dit" in found:
            return found
    return {}


def row_reason(row: dict) -> str:
    """A failed row's first reason, with the innermost frame of its traceback where it raised."""
    why = str((row.get("reasons") or [row.get("status")])[0]).split(" — ")[0]  # the reason, not the hint after it
    error = row.get("error") or {}
    return f"{str(why)[:300]}{where(error.get('traceback', '')) if isinstance(error, dict) else ''}"
