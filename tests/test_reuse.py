"""The result store (ditgate.run.reuse): a rerun reuses the reference rows nothing changed for, and only those.

Real runs of zoo:flux (and, in the full tier, zoo:wan and bf16): reused and fresh runs give the same verdicts and
numbers (timings aside); every part of the key changes it; a corrupted stored output is computed again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ditgate.core.model import Model
from ditgate.run.define import rows
from ditgate.run.reuse import Store, judged, keys, reusable, row_key
from ditgate.run.runner import RunConfig, run, warm_calls

SMALL = {"height": 64, "width": 64, "steps": 3}
TIMING = {"latency_s", "times", "speedup", "generate_s", "overhead", "peak_memory_bytes", "speedup_caveats",
          "prediction", "resumed", "reused_from", "media"}


def _untimed(value):
    """`value` without its timings (every key in TIMING or ending in `_s`: seconds) and what follows from them."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING and not k.endswith("_s")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _numbers(report: dict) -> dict:
    """Every row's verdict, metrics, proofs, facts and reasons: what must not change between a reused and a fresh
    run (timings aside)."""
    return {r["name"]: _untimed(r) for r in report["rows"]}


def _run(model: Model, out: Path, chosen, reuse: bool = True, **extra) -> dict:
    return run(RunConfig(model=model, rows=chosen, out=out, reuse=reuse, **extra), progress=lambda line: None)


def _model_copy(zoo_path, tmp_path: Path, **named) -> Model:
    folder = tmp_path / "flux"
    if not folder.exists():
        shutil.copytree(zoo_path("flux"), folder)
    return Model.open(str(folder), **(SMALL | named))


def test_every_key_part_changes_the_key(zoo_path, tmp_path):
    model = _model_copy(zoo_path, tmp_path)
    versions = {"torch": "2.x", "diffusers": "0.42.1"}
    gates = Path(__file__).resolve().parents[1] / "checklists" / "gates.json"
    base = row_key(model, rows.BASELINE, versions, None, None)
    assert base == row_key(model, rows.BASELINE, dict(versions), gates, None)  # the default table, named or not

    changed = {"request": row_key(_model_copy(zoo_path, tmp_path, steps=4), rows.BASELINE, versions, None, None),
               "dtype": row_key(_model_copy(zoo_path, tmp_path, dtype="bfloat16"), rows.BASELINE, versions, None,
                                None),
               "library version": row_key(model, rows.BASELINE, versions | {"diffusers": "0.0.faked"}, None, None),
               "row": row_key(model, rows.SENSITIVITY, versions, None, None),
               "plugin's split dims": row_key(model, rows.BASELINE, versions, None, {"transformer_blocks": 1})}
    edited_gates = tmp_path / "gates.json"
    table = json.loads(gates.read_text())
    table["rules"]["region"]["grid"] = int(table["rules"]["region"]["grid"]) + 1
    edited_gates.write_text(json.dumps(table))
    changed["gate table"] = row_key(model, rows.BASELINE, versions, edited_gates, None)
    weights = next((tmp_path / "flux" / "transformer").glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    changed["model file touched"] = row_key(model, rows.BASELINE, versions, None, None)
    config = tmp_path / "flux" / "scheduler" / "scheduler_config.json"
    stat = config.stat()
    config.write_text(config.read_text().replace("{", '{"ditgate_test": 1, ', 1))
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same time: the content alone changes the key
    changed["config edited"] = row_key(model, rows.BASELINE, versions, None, None)
    assert len(set(changed.values()) | {base}) == len(changed) + 1, changed
    # only reference rows are stored: a row with a feature (cache, parallelism, ...) runs its plugin every time
    assert all(reusable(r) for r in (rows.BASELINE, rows.BASELINE_TILED, rows.CALIBRATION, rows.SENSITIVITY))
    assert not any(reusable(r) for r in rows.DEFAULT_ROWS if r.phase)


def test_rerun_reuses_the_baseline_and_never_a_damaged_one(zoo_path, tmp_path, monkeypatch):
    monkeypatch.setenv("DITGATE_STORE", str(tmp_path / "store"))
    model = Model.open("zoo:flux", **SMALL)
    chosen = [rows.BASELINE]
    first = _run(model, tmp_path / "a", chosen)
    assert not first["reused"]
    second = _run(model, tmp_path / "b", chosen)
    assert second["reused"] == {"baseline": str((tmp_path / "a").resolve())}
    assert "reused from" in (tmp_path / "b" / "report.md").read_text()
    assert second["time"]["generate_s"] == 0  # nothing generated
    expected = np.load(tmp_path / "a/rows/baseline/output.npy")
    assert np.array_equal(expected, np.load(tmp_path / "b/rows/baseline/output.npy"))
    assert _numbers(first) == _numbers(second)

    # a stored output changed on disk is never trusted: the baseline is computed again (and stored again)
    entry = next((tmp_path / "store" / "entries").iterdir())
    damaged = entry / "output.npy"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.unlink()  # the run folders' hard links keep their own copy
    damaged.write_bytes(bytes(data))
    third = _run(model, tmp_path / "c", chosen)
    assert not third["reused"] and third["time"]["generate_s"] > 0
    assert np.array_equal(expected, np.load(tmp_path / "c/rows/baseline/output.npy"))
    assert Store().get(entry.name, tmp_path / "d", "baseline") is not None  # stored again, sound
    assert not _run(model, tmp_path / "e", chosen, reuse=False)["reused"]  # --fresh


def test_warm_up_once_per_process(zoo_path, tmp_path):
    model = Model.open("zoo:flux", **SMALL)
    report = _run(model, tmp_path / "w", [rows.BASELINE, rows.BASELINE_TILED], reuse=False, warmup=1)
    calls = {r["name"]: r["warmup_calls"] for r in report["rows"]}
    assert calls == {"baseline": 1, "baseline-tiled": 0}  # the baseline warmed the process for the row after it
    assert "Warm-up: once per process, by baseline" in (tmp_path / "w" / "report.md").read_text()
    compiled = dataclasses.replace(rows.BASELINE, name="compiled", compile=True)
    assert warm_calls(1, compiled, warmed=True) == 1 and warm_calls(2, rows.BASELINE, warmed=False) == 2
    # the matrix times every row after its own warm-up (ditgate.perf.acceptance passes warm_once=False)
    assert warm_calls(1, rows.BASELINE_TILED, warmed=False) == 1


@pytest.mark.full
def test_rerun_reuses_references_and_matches_a_fresh_run(zoo_path, tmp_path, monkeypatch):
    monkeypatch.setenv("DITGATE_STORE", str(tmp_path / "store"))
    model = Model.open("zoo:flux", **SMALL)
    chosen = rows.select(rows.DEFAULT_ROWS, "cache")
    first = _run(model, tmp_path / "a", chosen)
    second = _run(model, tmp_path / "b", chosen)
    assert second["reused"] == {"baseline": str((tmp_path / "a").resolve()),
                                "sensitivity": str((tmp_path / "a").resolve())}  # the cache row and its checks ran
    fresh = _run(model, tmp_path / "c", chosen, reuse=False)
    assert not fresh["reused"]
    assert _numbers(first) == _numbers(second) == _numbers(fresh)
    assert second["passed"] == fresh["passed"]


def test_store_is_bounded_and_atomic(tmp_path):
    run_dir = tmp_path / "run"
    store = Store(tmp_path / "store", limit=3000)
    for i in range(3):
        folder = run_dir / "rows" / f"baseline{i}"
        folder.mkdir(parents=True)
        np.save(folder / "output.npy", np.full(200, i, dtype=np.float32))
        (folder / "result.json").write_text(json.dumps({"name": f"baseline{i}", "status": "ok"}))
        store.put(f"k{i}", run_dir, f"baseline{i}")
        os.utime(store.root / "entries" / f"k{i}" / "entry.json", (i, i))  # k0 used longest ago
    assert 0 < store.size() <= 3000
    assert not (store.root / "entries" / "k0").exists() and (store.root / "entries" / "k2").exists()
    assert not any((store.root / "tmp").iterdir())  # nothing left half-built
    (store.root / "entries" / "k2" / "output.npy").unlink()  # a file gone: the entry is not trusted, and removed
    assert store.get("k2", tmp_path / "other", "baseline2") is None
    assert not (store.root / "entries" / "k2").exists()


def test_a_check_of_stored_outputs_is_kept_by_their_content(tmp_path, monkeypatch):
    """reuse.judged: measured once for the same inputs (arrays by content), again for changed ones, never with
    --fresh; a damaged kept result is measured again."""
    from types import SimpleNamespace

    from ditgate.run.judge.discrimination import _content

    monkeypatch.setenv("DITGATE_STORE", str(tmp_path / "store"))
    (tmp_path / "run.json").write_text(json.dumps({"versions": {"torch": "2.x"}}))
    measured = []

    def check(array):
        inputs = {"check": "test", "arrays": _content({"output": array, "noise": None})}
        return judged(cfg, tmp_path, inputs, lambda: measured.append(1) or {"passed": True, "n": len(measured)})

    cfg, array = SimpleNamespace(reuse=True), np.arange(6, dtype=np.float32)
    assert check(array) == check(array.copy()) == {"passed": True, "n": 1}
    assert check(array.reshape(2, 3))["n"] == 2  # another shape: other inputs
    for kept in (tmp_path / "store" / "judged").iterdir():
        kept.write_text("{")
    assert check(array)["n"] == 3
    cfg.reuse = False
    assert check(array)["n"] == 4 == len(measured)


def _same_when_reused(tmp_path, monkeypatch, model: Model, names: str, **extra) -> None:
    monkeypatch.setenv("DITGATE_STORE", str(tmp_path / "store"))
    chosen = rows.select(rows.DEFAULT_ROWS, names)
    first = _run(model, tmp_path / "a", chosen, **extra)
    second = _run(model, tmp_path / "b", chosen, **extra)
    fresh = _run(model, tmp_path / "c", chosen, reuse=False, **extra)
    assert second["reused"] and not fresh["reused"]
    assert _numbers(first) == _numbers(second) == _numbers(fresh)


@pytest.mark.full
def test_wan_reused_matches_fresh(zoo_path, tmp_path, monkeypatch):
    _same_when_reused(tmp_path, monkeypatch, Model.open("zoo:wan", steps=3), "cache,cp-ulysses-2")


@pytest.mark.full
def test_bf16_reused_matches_fresh(zoo_path, tmp_path, monkeypatch):
    # bf16: the calibration row is stored too; the twin rows reuse their own references
    _same_when_reused(tmp_path, monkeypatch, Model.open("zoo:flux", dtype="bfloat16", **SMALL), "cache")


def test_code_outside_the_folder_is_in_the_key(zoo_path, tmp_path, monkeypatch):
    """A --pipeline module (or an examples/ package the index names) is code the load runs: editing it changes the
    key; the same code elsewhere on disk does not matter."""
    package = tmp_path / "code" / "keyed_pipe"
    package.mkdir(parents=True)
    source = "from diffusers import FluxPipeline\n\n\nclass KeyedPipe(FluxPipeline):\n    pass\n"
    (package / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    folder = tmp_path / "flux"
    shutil.copytree(zoo_path("flux"), folder)
    model = Model.open(str(folder), pipeline="keyed_pipe:KeyedPipe", **SMALL)
    versions = {"torch": "2.x"}
    before = row_key(model, rows.BASELINE, versions, None, None)
    assert before == row_key(model, rows.BASELINE, versions, None, None)
    (package / "__init__.py").write_text(source.replace("pass", "guidance = 2.0"))
    assert row_key(model, rows.BASELINE, versions, None, None) != before
    # zoo:tinymm's package lives in examples/: its code is part of the key too
    assert keys.model_code(Model.open("zoo:tinymm", **SMALL)) != keys.model_code(Model.open("zoo:flux", **SMALL))
