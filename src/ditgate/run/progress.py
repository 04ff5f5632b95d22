"""The progress lines of a run (stderr, through the command's progress callable).

- The total is known at the start: the chosen rows plus the rows the runner adds by itself (the sensitivity rows
  when a row is gated, the calibration row when a gated row uses the floor, each cache row's caching-off twin),
  counted before anything runs (`planned`). Only an audio model in float32 whose class does not say so can add a
  row the count did not foresee; the line then says the total grew and why.
- A worker group prints a start line (its rows and ranks) and, while it runs, a heartbeat every `HEARTBEAT_S`
  seconds with each rank's stage, so minutes of parallel rows on a GPU never pass in silence.
- A resumed row says "reused"; a row that failed says why, shortened at a word boundary, never mid-word.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

from ditgate.run.exec.worker import status_path

HEARTBEAT_S = 30.0  # seconds between two heartbeat lines of a running worker group
REASON_CHARS = 160  # a failure's reason on its progress line (report.md has it whole)


def planned(rows: list, steps: int | None, dtype: str, pipeline: str | None, gates: dict | None) -> int:
    """How many rows a run records: `rows` and the ones the runner adds by itself (see the module's doc)."""
    from ditgate.gates.calibration import uses_floor
    from ditgate.run.define.rows import CALIBRATION
    from ditgate.run.judge.cache_off import twin
    from ditgate.run.judge.discrimination import needed

    names = {r.name for r in rows}
    gated = [r for r in rows if r.phase]
    modality = "audio" if "audio" in (pipeline or "").lower() else "image"
    extra = sum(1 for r in needed([r.phase for r in gated], [modality], dtype, gates) if r.name not in names)
    if gated and CALIBRATION.name not in names and uses_floor(modality, dtype, gates):
        extra += 1
    extra += sum(1 for r in rows if (t := twin(r, steps)) is not None and t.name not in names)
    return len(rows) + extra


def shorten(text: str, width: int = REASON_CHARS) -> str:
    """`text` on one line, at most `width` characters, cut between words ("..." where it was cut)."""
    one_line = " ".join(str(text).split())
    return textwrap.shorten(one_line, width, placeholder=" ...") if len(one_line) > width else one_line


class Lines:
    """Formats and prints the progress of one run."""

    def __init__(self, say: Callable[[str], None], total: int, heartbeat_s: float | None = None):
        self.say = say
        self.total = total
        self.done = 0
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self._group_start = 0.0
        self._last_beat = 0.0

    def _count(self, recorded: int) -> str:
        if recorded > self.total:
            self.say(f"      (the run added a row the start did not count: {recorded} rows now)")
            self.total = recorded
        return f"[{self.done:>{len(str(self.total))}}/{self.total}]"

    def row(self, row, result: dict[str, Any], recorded: int) -> None:
        """A row finished (or was reused, or refused)."""
        self.done += 1
        if result.get("reused_from"):
            what = f"reused from {result['reused_from']}"
        elif result.get("resumed"):
            what = "reused (its result from an earlier run of this folder)"
        elif result.get("status") == "ok":
            what = f"{result['latency_s']:.2f} s" if result.get("latency_s") is not None else "ok"
        else:
            what = "ERROR " + shorten((result.get("error") or {}).get("message", ""))
        self.say(f"{self._count(recorded)} {row.name:<18} {row.world_size} rank(s)  {what}")

    def group_started(self, rows: list, size: int) -> None:
        self._group_start = self._last_beat = time.monotonic()
        self.say(f"      starting {size} ranks for {', '.join(r.name for r in rows)}")

    def beat(self, rows_left: list, size: int, group_dir: str | Path) -> None:
        """Called while a group runs; prints a heartbeat when HEARTBEAT_S passed since the last line."""
        now = time.monotonic()
        if not rows_left or now - self._last_beat < self.heartbeat_s:
            return
        self._last_beat = now
        stages = []
        for rank in range(size):
            try:
                status = json.loads(status_path(Path(group_dir), rank).read_text())
                stages.append(f"rank {rank}: {status.get('row') or '-'} {status.get('stage')}")
            except (OSError, ValueError):
                stages.append(f"rank {rank}: starting")
        self.say(f"      ... {', '.join(r.name for r in rows_left)} running on {size} ranks for "
                 f"{now - self._group_start:.0f} s ({'; '.join(stages)})")
