"""The run folder's guard: the run's options checked before any folder is made, and one run at a time per folder.

A run holds `RUN/.lock` locked (`flock`) from the moment it takes the folder until it ends; the file names its pid.
A second run, or a `--resume`, into a folder whose lock is held is refused with the holder's pid. The kernel lets go
of the lock when its process dies however it dies, so the lock file a killed run leaves behind is stale by itself:
the next run takes it over.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.run.exec import files as store

LOCK = ".lock"


class RunFolderError(DitgateError):
    """The run folder cannot be used (exists without --resume, belongs to another run, is in use, or cannot be
    written)."""


def check_options(cfg: Any) -> None:
    """Refuse options a run cannot use, before anything is made: timeout, warm-up, repeats and the integration file
    (the model's dtype and device were checked when it was opened: ditgate.core.model)."""
    timeout = cfg.timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout < math.inf):
        raise DitgateError(f"--timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(cfg.warmup, bool) or not isinstance(cfg.warmup, int) or cfg.warmup < 0:
        raise DitgateError(f"--warmup must be 0 or more calls, got {cfg.warmup!r}")
    if isinstance(cfg.repeats, bool) or not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise DitgateError(f"--repeats must be 1 or more calls, got {cfg.repeats!r}")
    if cfg.integration is not None and not Path(cfg.integration).is_file():
        raise DitgateError(f"--integration {cfg.integration}: no such file")


def _holder(lock_file: Path) -> str:
    try:
        data = json.loads(lock_file.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    return f"pid {data['pid']}" if isinstance(data, dict) and "pid" in data else "another process"


class FolderLock:
    """The lock of one run folder, held until `release` (or until this process ends)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self._fd: int | None = None
        self.stale: str | None = None  # the holder a killed run left in the lock file, when there was one
        self.created = False  # whether this run made the folder (set by `prepare`)

    def acquire(self) -> "FolderLock":
        if self.path.is_symlink():  # opening it would truncate whatever it points at
            raise RunFolderError(f"{self.path} is a symbolic link (to {os.readlink(self.path)}); a run writes only "
                                 "inside its folder: remove the link, or choose another --out")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise RunFolderError(f"cannot write the run folder {self.run_dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderError(f"{self.run_dir} is in use by a running ditgate run ({_holder(self.path)}); wait "
                                 "for it to end, or choose another --out") from None
        previous = os.read(fd, 4096).decode(errors="replace").strip()
        if previous:
            self.stale = _holder(self.path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid()}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            os.close(self._fd)  # closing the file lets go of the lock
            self._fd = None


def open_folder(run_dir: Path, resume: bool) -> tuple[FolderLock, bool]:
    """Create (when needed) and lock `run_dir`: (the lock, whether this call created the folder). The folder must be
    a folder, writable, and either empty, a run folder, or absent."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"--out {run_dir} is a file, not a folder")
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}") from None
    try:
        lock = FolderLock(run_dir).acquire()
    except RunFolderError:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return lock, created


def abandon(run_dir: Path, lock: FolderLock, created: bool) -> None:
    """Undo `open_folder` after a refusal: the lock let go, and the folder removed again when this run made it."""
    lock.release()
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        Path(run_dir, LOCK).unlink(missing_ok=True)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"cannot resume {run_dir}: {path} cannot be read ({exc}); choose another --out") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"cannot resume {run_dir}: {path} is not a run description (a JSON object)")
    return data


def default_out(model: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(model).removeprefix("zoo:")).name).strip("-") or "model"
    return Path("runs") / f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _identity(cfg: Any) -> dict[str, Any]:
    m = cfg.model
    return {"model": m.name, "model_path": str(m.path), "request": m.request.to_dict(), "dtype": m.dtype,
            "device": m.device, "integration": str(cfg.integration) if cfg.integration else None}


def refuse_links(run_dir: Path, doing: str = "resume") -> None:
    """A run reads and writes only inside its folder: a symbolic link in it (a row folder linked elsewhere, a linked
    result.json) would have --resume write, or remove, whatever it points at, and a copy of its rows copy it."""
    for folder, dirs, names in os.walk(run_dir):
        for name in sorted(dirs + names):
            path = Path(folder, name)
            if path.is_symlink():
                raise RunFolderError(f"cannot {doing} {run_dir}: {path} is a symbolic link (to {os.readlink(path)}); "
                                     "a run reads and writes only inside its folder: remove the link, or choose "
                                     "another folder")


def check_resumable(run_dir: Path, cfg: Any) -> None:
    """Raise RunFolderError unless the run in `run_dir` has the model, request, dtype, device and integration of
    `cfg` (rows are checked one by one, by fingerprint, when they are resumed)."""
    refuse_links(run_dir)
    previous = read_run_json(run_dir)
    changed = [k for k, v in _identity(cfg).items() if previous.get(k) != v]
    if changed:
        raise RunFolderError(f"cannot resume {run_dir}: {', '.join(changed)} differ from the run it holds")


def prepare(cfg: Any, versions) -> tuple[Path, FolderLock]:
    """The run folder of `cfg` (a RunConfig), locked for this run; refused before anything is written in it.
    `versions()` gives the library versions recorded in run.json."""
    run_dir = Path(cfg.out) if cfg.out else default_out(cfg.model.name)
    lock, created = open_folder(run_dir, cfg.resume)
    lock.created = created  # a run that ends in a user error before any row removes the folder it made
    try:
        run_file = run_dir / "run.json"
        if run_file.is_file():
            if not cfg.resume:
                raise RunFolderError(f"{run_dir} already holds a run; pass --resume to continue it, or choose "
                                     "another --out")
            check_resumable(run_dir, cfg)
        elif any(p.name != LOCK for p in run_dir.iterdir()):
            raise RunFolderError(f"{run_dir} exists and is not a ditgate run folder")
        store.write_json(run_file, _identity(cfg) | {"versions": versions(),
                                                                 "rows": [r.to_dict() for r in cfg.rows]})
    except BaseException:
        abandon(run_dir, lock, created)
        raise
    return run_dir, lock


def copy_finished_rows(source: Path, run_dir: Path, names: list[str]) -> None:
    """Seed `run_dir` with the finished rows `names` of the run in `source` (and its run.json), so that a run there
    with `resume=True` reuses them: the runner still checks that model, request, dtype, device and integration are
    the same, and each row's fingerprint, and computes whatever does not match."""
    (run_dir / "rows").mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "run.json", run_dir / "run.json")
    for name in names:
        if (source / "rows" / name / store.RESULT).is_file():
            shutil.copytree(source / "rows" / name, run_dir / "rows" / name)


def done(run_dir: Path, row: Any, resume: bool) -> dict[str, Any] | None:
    if not resume:
        return None
    try:
        result = store.load_result(run_dir, row.name)
    except (OSError, ValueError):  # unreadable: the row runs again
        return None
    if not (isinstance(result, dict) and result.get("status") == "ok"
            and result.get("fingerprint") == row.fingerprint()):
        return None
    return result if store.outputs_readable(run_dir, row.name) else None


def versions() -> dict[str, str]:
    """The library versions a run records (run.json, report.json), and where cache-dit was imported from."""
    import cache_dit
    import diffusers
    import torch
    import transformers

    from ditgate.core.logs import library_logs_to_stderr

    library_logs_to_stderr()  # cache-dit logs to stdout; stdout is the report's (--json)

    return {"torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "cache_dit": cache_dit.__version__,
            "cache_dit_from": str(Path(cache_dit.__file__).parent), "python": sys.version.split()[0]}
