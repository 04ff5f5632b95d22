"""The result store: finished reference rows kept by key under `$DITGATE_HOME/store` (or `$DITGATE_STORE`), for
later runs to reuse.

    STORE/entries/KEY/result.json     the row's result as its run recorded it
    STORE/entries/KEY/*.npy, output.* its outputs (the files of RUN/rows/NAME)
    STORE/entries/KEY/entry.json      written last: every file's SHA-256 and size, the run it came from

An entry is built in a temporary folder and renamed into place, so a crash leaves no half-written entry. Reading
one checks every file against entry.json; an entry that does not match (a file changed, cut short, missing or
added, a link where a file was, a result that is not a finished row) is removed and its row computed again. A
store that cannot be written costs the next run time, never this run its result. The store is bounded: after each
write, the least recently used entries (entry.json's modification time, renewed on every reuse) go until the store
fits `$DITGATE_STORE_MAX_BYTES` (default 4 GiB; 0 keeps nothing).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ditgate.run.exec import files

ENTRY = "entry.json"
LIMIT_ENV = "DITGATE_STORE_MAX_BYTES"
ROOT_ENV = "DITGATE_STORE"  # the store's folder, when not $DITGATE_HOME/store
DEFAULT_LIMIT = 4 << 30


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _place(source: Path, target: Path) -> None:
    """`source` at `target`: a hard link where the file system allows it (no copy of the bytes), else a copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class Store:
    def __init__(self, root: Path | None = None, limit: int | None = None):
        from ditgate.run.reuse.keys import home

        self.root = Path(root or os.environ.get(ROOT_ENV) or home() / "store")
        self.limit = int(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT)) if limit is None else limit

    def _entry(self, key: str) -> Path:
        return self.root / "entries" / key

    def _verified(self, key: str) -> dict[str, Any] | None:
        """entry.json of `key` when every file it lists is there with its size and hash; else None (and the
        entry removed: it is never trusted again)."""
        folder = self._entry(key)
        if not (folder / ENTRY).is_file():
            return None
        try:
            meta = json.loads((folder / ENTRY).read_text())
            listed = meta["files"]
            present = {p.name for p in folder.iterdir() if p.name != ENTRY}
            plain = not any(p.is_symlink() or not p.is_file() for p in folder.iterdir())  # a link is never trusted
            ok = plain and present == set(listed) and files.RESULT in listed and all(
                (folder / name).stat().st_size == info["bytes"] and _sha256(folder / name) == info["sha256"]
                for name, info in listed.items())
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return meta

    def get(self, key: str, run_dir: Path, name: str) -> dict[str, Any] | None:
        """Place the stored row `key` into `run_dir/rows/name` and return its result (with `reused_from`: the run
        that computed it); None when the store holds no sound entry for the key."""
        meta = self._verified(key)
        if meta is None:
            return None
        folder = self._entry(key)
        try:
            result = json.loads((folder / files.RESULT).read_text())
        except (OSError, ValueError):
            result = None
        if not isinstance(result, dict) or result.get("status") != "ok":  # never stored so: not to be trusted
            shutil.rmtree(folder, ignore_errors=True)
            return None
        if result.get("name") != name:
            return None
        target = files.row_dir(run_dir, name)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for file_name in meta["files"]:
            if file_name != files.RESULT:
                _place(folder / file_name, target / file_name)
        result = result | {"reused_from": meta["run"]}
        files.write_json(target / files.RESULT, result)  # last: its presence means the row is there
        os.utime(folder / ENTRY)  # used now: the last to go
        return result

    def put(self, key: str, run_dir: Path, name: str) -> None:
        """Keep the finished row `name` of `run_dir` under `key` (replacing an entry of the same key)."""
        source = files.row_dir(run_dir, name)
        result = files.load_result(run_dir, name)
        if self.limit <= 0 or not result or result.get("status") != "ok" or result.get("reused_from"):
            return
        try:
            (self.root / "tmp").mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=self.root / "tmp"))
        except OSError:
            return  # a store that cannot be written (a file, read-only, full) costs the next run time, nothing else
        try:
            listed = {}
            for path in sorted(p for p in source.iterdir()
                               if p.is_file() and not p.is_symlink() and not p.name.startswith(".")):
                shutil.copy2(path, staging / path.name)
                listed[path.name] = {"bytes": (staging / path.name).stat().st_size,
                                     "sha256": _sha256(staging / path.name)}
            files.write_json(staging / ENTRY, {"key": key, "row": name, "run": str(Path(run_dir).resolve()),
                                               "stored": time.time(), "files": listed})
            final = self._entry(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.rename(staging, final)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return  # a store that cannot be written costs the next run time, never this run its result
        self.prune()

    JUDGED_KEPT = 1000  # checks kept (a few hundred bytes each), the oldest out first

    def judged(self, key: str) -> dict[str, Any] | None:
        """A check's result stored under `key` (put_judged), or None (none, or not a sound one)."""
        try:
            found = json.loads((self.root / "judged" / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return found.get("result") if isinstance(found, dict) and found.get("key") == key and isinstance(
            found.get("result"), dict) else None

    def put_judged(self, key: str, result: dict[str, Any]) -> None:
        """Keep a check's result under `key`: written whole or not at all; the oldest go beyond JUDGED_KEPT."""
        if self.limit <= 0:
            return
        folder = self.root / "judged"
        try:
            files.write_json(folder / f"{key}.json", {"key": key, "result": result})
            kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            for old in kept[:max(0, len(kept) - self.JUDGED_KEPT)]:
                old.unlink(missing_ok=True)
        except (OSError, TypeError, ValueError):
            return  # a store that cannot be written costs the next run time, never this run its result

    def size(self) -> int:
        """Bytes the store holds on disk (its entries)."""
        entries = self.root / "entries"
        return sum(p.stat().st_size for p in entries.rglob("*") if p.is_file()) if entries.is_dir() else 0

    def prune(self) -> None:
        """Remove the least recently used entries until the store fits its limit."""
        entries = self.root / "entries"
        if not entries.is_dir():
            return
        sized = []
        for folder in entries.iterdir():
            try:
                used = (folder / ENTRY).stat().st_mtime
            except OSError:
                used = 0.0  # no entry.json: a leftover, first to go
            sized.append((used, sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()), folder))
        total = sum(size for _, size, _ in sized)
        for _, size, folder in sorted(sized, key=lambda item: item[0]):
            if total <= self.limit:
                break
            shutil.rmtree(folder, ignore_errors=True)
            total -= size


def judged(cfg, run_dir: Path, inputs: dict[str, Any], compute) -> dict[str, Any]:
    """The result of a check of stored outputs (`compute()`, a JSON-ready dict) measured once for `inputs`: kept in
    the store under a key of `inputs` (the arrays by their content), ditgate's code and the run's library versions,
    and read back by later runs that reuse (a run with --fresh measures it again)."""
    from ditgate.run.reuse.keys import ditgate_code, versions_of

    if not cfg.reuse:
        return compute()
    blob = json.dumps({"inputs": inputs, "ditgate": ditgate_code(), "versions": versions_of(run_dir)},
                      sort_keys=True, default=str)
    key = hashlib.sha256(blob.encode()).hexdigest()[:32]
    store = Store()
    found = store.judged(key)
    if found is None:
        found = compute()
        store.put_judged(key, found)
    return found

