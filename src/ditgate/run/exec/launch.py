"""Start a worker group and watch it: progress, crashed ranks, killed ranks, hung ranks, timeouts.

On CPU the ranks are forked from the run's own process when it holds the pristine pipeline (`pristine=`): they
inherit its imports and its weights, so a group starts in well under a second. Elsewhere (CUDA, which a forked
process cannot use once its parent has touched it, and `--launch per-row`) torchrun starts them. A CPU rank never
sees a GPU, also on a machine that has one (a reduced-precision run's twin rows): cache-dit would place its meshes
there; and once this process has used CUDA its CPU groups start under torchrun, since a forked child cannot.

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

from ditgate.run.exec import lifeline
from ditgate.run.exec.files import write_json
from ditgate.run.exec.worker import cpu_threads, error_path, status_path


@dataclass
class GroupOutcome:
    returncode: int | None
    timed_out: bool
    errors: list[dict[str, Any]] = field(default_factory=list)  # per-rank error records
    stages: list[dict[str, Any]] = field(default_factory=list)  # last status of every rank
    log_tail: str = ""
    exits: dict[int, int] = field(default_factory=dict)  # rank -> exit status (negative: killed by that signal)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.errors

    def describe(self) -> str:
        """One paragraph for the report: which rank failed or hung, where, and why."""
        if self.timed_out:
            where = "; ".join(f"rank {s['rank']} in row {s.get('row')!r} at stage {s.get('stage')!r}"
                              for s in self.stages) or "no rank reported a stage"
            return f"no progress for the timeout, group killed: {where}"
        # a rank killed by a signal (not the SIGTERM that ends a failed group) is the cause: the errors of the ranks
        # left waiting for it in a collective follow from it
        killed = {rank: -code for rank, code in self.exits.items() if code < 0 and -code != signal.SIGTERM}
        first = min(self.errors, key=lambda e: e.get("time", 0)) if self.errors else None
        if killed:
            rank = min(killed)
            where = next((s for s in self.stages if s["rank"] == rank), {})
            then = (f"; then rank {first['rank']} failed at stage {first.get('stage')!r}: {first['type']}: "
                    f"{' '.join(first['message'].split())[:200]}" if first else "")
            return (f"rank {rank} was killed by {signal.Signals(killed[rank]).name} in row {where.get('row')!r} at "
                    f"stage {where.get('stage')!r}{then}; log tail:\n{self.log_tail}")
        if first:
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


class _Forked:
    """The ranks forked from this process, watched like one torchrun process: `poll()` is None while every rank
    runs; as soon as one fails the others are ended (as torchrun does) and `poll()` is 1."""

    def __init__(self, job: dict[str, Any], world_size: int, pristine, log) -> None:
        from ditgate.run.exec import worker

        port = _free_port()
        self.pids: list[int] = []
        self.exits: dict[int, int] = {}
        self.returncode: int | None = None
        for stream in (sys.stdout, sys.stderr):  # a child would write out what is buffered again (a notebook shows
            try:                                  # every such line once per rank)
                stream.flush()
            except Exception:  # noqa: BLE001 - nothing to flush
                pass
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:  # the rank: never returns into the caller's code
                code = 1
                try:
                    os.setpgid(0, self.pids[0] if self.pids else 0)
                    code = worker.forked(job, rank, world_size, port, pristine, log.fileno())
                finally:
                    for stream in (sys.stdout, sys.stderr):
                        try:
                            stream.flush()
                        except Exception:  # noqa: BLE001 - exiting anyway
                            pass
                    os._exit(code)
            try:
                os.setpgid(pid, self.pids[0] if self.pids else pid)
            except OSError:  # the rank set it itself already
                pass
            self.pids.append(pid)
        self.pid = self.pids[0]  # the process group's id

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        for rank, pid in enumerate(self.pids):
            if rank not in self.exits:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.exits[rank] = os.waitstatus_to_exitcode(status)
        if any(code != 0 for code in self.exits.values()):
            self.exits_seen = dict(self.exits)  # how the ranks ended before this process ended the others
            _kill(self)
            self.returncode = 1
        elif len(self.exits) == len(self.pids):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for rank, pid in enumerate(self.pids):
            while rank not in self.exits:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.exits.setdefault(rank, os.waitstatus_to_exitcode(status))
                elif time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired("forked ranks", timeout)
                else:
                    time.sleep(0.05)
        if self.returncode is None:
            self.returncode = 0 if all(code == 0 for code in self.exits.values()) else 1


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(job: dict[str, Any], world_size: int, *, timeout: float,
              on_poll: Callable[[], None] | None = None, poll: float = 0.05,
              module: str = "ditgate.run.exec.worker", pristine=None) -> GroupOutcome:
    """Run `job` on `world_size` ranks and wait for it: `python -m MODULE JOB.json` under torchrun (default: the
    row worker, see ditgate.run.exec.worker; `ditgate diff` starts its own). `pristine` (CPU, the row worker only): the
    pipeline this process loaded; the ranks are forked from this process and use it instead."""
    group_dir = Path(job["group_dir"])
    group_dir.mkdir(parents=True, exist_ok=True)
    for old in list(group_dir.glob("rank*.json")):
        old.unlink()
    job_file = group_dir / "job.json"
    # every rank exits when this process is gone; `launched_at`: the ranks measure their start from it
    job = job | {"owner_pid": os.getpid(), "launched_at": time.time()}
    write_json(job_file, job)
    log_file = group_dir / "log.txt"
    env = dict(os.environ, CACHE_DIT_LOG_LEVEL=os.environ.get("CACHE_DIT_LOG_LEVEL", "warning"),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # torchrun dies with this process (ditgate.run.exec.lifeline), and its ranks with torchrun
    cmd = lifeline.command(os.getpid(), [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         f"--nproc_per_node={world_size}", "-m", module, str(job_file)])
    if str(job.get("model", {}).get("device", "cpu")).startswith("cuda"):
        from ditgate.core import warm

        warm.drop()  # the ranks need the GPU memory a pipeline kept for a later command holds (`ditgate serve`)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU rank never sees a GPU
        env.setdefault("OMP_NUM_THREADS", cpu_threads(world_size))
        if _parent_used_cuda():
            pristine = None
    with open(log_file, "ab") as log:
        if pristine is not None:
            proc = _Forked(job, world_size, pristine, log)
        else:
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
                        log_tail=_tail(log_file),
                        exits=getattr(proc, "exits_seen", None) or getattr(proc, "exits", None) or _exits(log_file))


def _parent_used_cuda() -> bool:
    """True when this process has initialised CUDA: a process forked from it could not run."""
    return "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()


def _exits(log_file: Path) -> dict[int, int]:
    """The ranks torchrun's failure summary names, with their exit status."""
    import re

    found = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", _tail(log_file, 200))
    return {int(rank): int(code) for rank, code in found}


def _kill(proc) -> None:
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
