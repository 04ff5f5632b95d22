"""Worker processes die with the run that started them.

`ditgate run` starts torchrun in a new session (so the whole group can be killed at once), which also means a
SIGKILL of `ditgate run` would leave torchrun and its ranks running, a hung rank spinning for ever. Two guards:

- the parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`): torchrun gets SIGKILL when `ditgate run` dies (it is
  started through `python -m ditgate.run.exec.lifeline OWNER_PID CMD...`, which sets the signal and then execs CMD), and
  every rank gets SIGKILL when torchrun dies (each rank calls `die_with_parent` at start);
- a watchdog thread in every rank (`watch_parents`) that ends the rank when its parent changes or the `ditgate run`
  process named in the job is gone, for systems without the signal and for the moment before it was set.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: it is only waiting to be reaped
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def watch_parents(owner_pid: int | None, interval: float = 1.0) -> threading.Thread:
    """End this process (exit status 1) as soon as its parent changes or `owner_pid` (the `ditgate run` process)
    is gone; runs as a daemon thread."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent or (owner_pid and not _alive(owner_pid)):
                os._exit(1)
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="ditgate-lifeline", daemon=True)
    thread.start()
    return thread


def command(owner_pid: int, cmd: list[str]) -> list[str]:
    """`cmd`, run so that it gets SIGKILL when the process `owner_pid` (its parent) dies."""
    return [sys.executable, "-m", "ditgate.run.exec.lifeline", str(owner_pid), *cmd]


def _exec(argv: list[str]) -> None:
    owner, cmd = int(argv[0]), argv[1:]
    die_with_parent()
    if os.getppid() != owner:  # the parent died before the signal was set
        sys.exit(1)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    _exec(sys.argv[1:])
