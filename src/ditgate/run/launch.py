"""Start a torchrun worker group and watch it: progress, crashed ranks, hung ranks, timeouts.

A group ends when torchrun exits, or when no rank has moved to a new stage for `timeout` seconds: then the whole
process group is killed and the ranks' last stages are reported (a rank stuck in a collective waits at the stage
it reached, so the report shows where each one stopped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.run import lifeline
from ditgate.run.store import write_json
from ditgate.run.worker import error_path, status_path


@dataclass
class GroupOutcome:
    returncode: int | None
    timed_out: bool
    errors: list[dict[str, Any]] = field(default_factory=list)  # per-rank error records
    stages: list[dict[str, Any]] = field(default_factory=list)  # last status of every rank
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.errors

    def describe(self) -> str:
        """One paragraph for the report: which rank failed or hung, where, and why."""
        if self.timed_out:
            where = "; ".join(f"rank {s['rank']} in row {s.get('row')!r} at stage {s.get('stage')!r}"
                              for s in self.stages) or "no rank reported a stage"
            return f"no progress for the timeout, group killed: {where}"
        if self.errors:
            first = min(self.errors, key=lambda e: e.get("time", 0))
            others = sorted({e["rank"] for e in self.errors} - {first["rank"]})
            text = (f"rank {first['rank']} failed in row {first.get('row')!r} at stage {first.get('stage')!r}: "
                    f"{first['type']}: {first['message']}")
            return text + (f" (ranks {others} failed too)" if others else "")
        return f"torchrun exited with code {self.returncode} and no rank reported an error; log tail:\n{self.log_tail}"


def _read_all(group_dir: Path, world_size: int, path_of) -> list[dict[str, Any]]:
    found = []
    for rank in range(world_size):
        path = path_of(group_dir, rank)
        if path.is_file():
            try:
                record = json.loads(path.read_text())
                record.setdefault("time", path.stat().st_mtime)
                found.append(record)
            except (json.JSONDecodeError, OSError):
                pass
    return found


def run_group(job: dict[str, Any], world_size: int, *, timeout: float,
              on_poll: Callable[[], None] | None = None, poll: float = 0.5,
              module: str = "ditgate.run.worker") -> GroupOutcome:
    """Run `job` on `world_size` ranks and wait for it: `python -m MODULE JOB.json` under torchrun (default: the
    row worker, see ditgate.run.worker; `ditgate diff` starts its own)."""
    group_dir = Path(job["group_dir"])
    group_dir.mkdir(parents=True, exist_ok=True)
    for old in list(group_dir.glob("rank*.json")):
        old.unlink()
    job_file = group_dir / "job.json"
    write_json(job_file, job | {"owner_pid": os.getpid()})  # every rank exits when this process is gone
    log_file = group_dir / "log.txt"
    env = dict(os.environ, CACHE_DIT_LOG_LEVEL=os.environ.get("CACHE_DIT_LOG_LEVEL", "warning"),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # torchrun dies with this process (ditgate.run.lifeline), and its ranks with torchrun
    cmd = lifeline.command(os.getpid(), [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         f"--nproc_per_node={world_size}", "-m", module, str(job_file)])
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        last_change, last_seen, timed_out = time.monotonic(), None, False
        try:
            while proc.poll() is None:
                time.sleep(poll)
                stages = _read_all(group_dir, world_size, status_path)
                seen = sorted((s["rank"], s.get("row"), s.get("stage"), s.get("time")) for s in stages)
                if seen != last_seen:
                    last_seen, last_change = seen, time.monotonic()
                if on_poll:
                    on_poll()
                if time.monotonic() - last_change > timeout:
                    timed_out = True
                    break
        finally:
            if proc.poll() is None:
                _kill(proc)
    return GroupOutcome(returncode=proc.returncode, timed_out=timed_out,
                        errors=_read_all(group_dir, world_size, error_path),
                        stages=_read_all(group_dir, world_size, status_path),
                        log_tail=_tail(log_file))


def _kill(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
