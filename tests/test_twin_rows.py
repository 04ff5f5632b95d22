"""Twin rows (ditgate.run.twinned): a reduced-precision run proves its structural rows again on the model's float32
twin, and a row passes only when both pass.

The model is the zoo's Wan made 16 blocks deep (a real video DiT's depth, as far as bf16 rounding is concerned: the
calibrated floor falls with depth while a fault in one block stays one block's). On it, two realistic faults pass
every bf16 gate — a CP attention left on a processor that ignores the CP config, a TP plan that does not divide one
cross-attention's heads — and both fail on the twin's float32 tensor rule.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ditgate.core.errors import DitgateError
from ditgate.core.model import Model
from ditgate.run import twinned
from ditgate.run.define import rows
from ditgate.run.runner import RunConfig, run

PLUGINS = Path(__file__).parent / "plugins"
FAULTS = PLUGINS / "wan_bf16_hidden_faults.py"
GOOD = PLUGINS / "wan_good.py"
WEIGHTS = ("*.safetensors", "*.bin")


@pytest.fixture(scope="module")
def deep_wan(tmp_path_factory, zoo_path):
    """zoo:wan with a 16-block transformer (seeded), saved like any model."""
    from diffusers import WanTransformer3DModel

    folder = tmp_path_factory.mktemp("deep-wan") / "wan16"
    shutil.copytree(zoo_path("wan"), folder)
    config = {k: v for k, v in json.loads((folder / "transformer" / "config.json").read_text()).items()
              if not k.startswith("_")}
    torch.manual_seed(0)
    model = WanTransformer3DModel(**(config | {"num_layers": 16})).eval()
    shutil.rmtree(folder / "transformer")
    model.save_pretrained(folder / "transformer")
    return folder


def _configs_only(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*WEIGHTS))
    assert not any(target.rglob("*.safetensors"))
    return target


def _run(model: Model, names: str, out: Path, integration: Path, twin: str = "auto") -> dict:
    cfg = RunConfig(model=model, rows=rows.select(rows.DEFAULT_ROWS, names), out=out, integration=integration,
                    twin=twin)
    return run(cfg, progress=lambda line: None)


def _rows(report: dict) -> dict:
    return {r["name"]: r for r in report["rows"]}


@pytest.mark.full  # 16 s of the fast tier; the twin-only run below stays fast
def test_bf16_gates_pass_two_realistic_faults_the_twin_fails(deep_wan, tmp_path):
    report = _run(Model.open(deep_wan, dtype="bfloat16", steps=4), "cp-ulysses-2,tp-2", tmp_path / "run", FAULTS)
    got = _rows(report)
    for name in ("cp-ulysses-2", "tp-2"):
        row = got[name]
        # the bf16 gates alone: the calibrated floor, the first-step check, the proofs: all pass
        assert row["verdict"]["passed"], (name, row["reasons"])
        assert all(p["passed"] for p in row["proofs"]), row["proofs"]
        assert row["verdict"]["floor"], "judged against the calibrated floor"
        # the twin, in float32: the tensor rule fails, by far
        twin = row["twin"]
        assert twin["status"] == "failed", twin
        assert any(r.startswith("max_abs") for r in twin["reasons"]), twin
        assert row["status"] == "failed" and row["reasons"][0].startswith("twin (float32)")
    assert not report["passed"]
    record = report["twin"]
    assert record["status"] == "ran" and record["twin"]["params"] < 10**6
    assert (Path(record["folder"]) / "report.json").is_file()
    twin_rows = _rows(json.loads((Path(record["folder"]) / "report.json").read_text()))
    limit = {c["metric"]: c for c in twin_rows["cp-ulysses-2"]["verdict"]["checks"]}["max_abs"]
    assert limit["value"] > 10 * limit["threshold"], limit  # not a marginal miss: an order of magnitude at least
    md = (Path(report["run_dir"]) / "report.md").read_text()
    assert "## Structure on the twin (float32)" in md and "FAILED on cp-ulysses-2, tp-2" in md


def test_twin_only_needs_no_weights_and_proves_a_correct_plugin(zoo_path, tmp_path):
    folder = _configs_only(zoo_path("wan"), tmp_path / "wan-configs")
    report = _run(Model.open(folder), "cp-ulysses-2,tp-2", tmp_path / "run", GOOD, twin="only")
    got = _rows(report)
    assert report["passed"], [(r["name"], r["reasons"]) for r in report["rows"]]
    assert got["cp-ulysses-2"]["verdict"]["checks"] and got["tp-2"]["status"] == "passed"
    assert report["twin"]["mode"] == "only" and report["twin"]["source"] == str(folder)
    assert report["model"].startswith("twin of")
    md = (Path(report["run_dir"]) / "report.md").read_text()
    assert "**twin only**" in md and "numerics unproven" in md


def test_which_rows_the_twin_judges():
    by_name = {r.name: r for r in rows.DEFAULT_ROWS}
    judged = {r.name for r in rows.DEFAULT_ROWS if twinned.covers(r)}
    assert judged == {"cache", "cp-ulysses-2", "cp-ring-2", "tp-2", "tp-2+tep", "tp-2+vaep", "cache+ulysses-2",
                      "hybrid-u2xtp2"}
    assert {r.name for r in twinned.rows_for([by_name["tp-2+vaep"]])} == {"baseline-tiled", "tp-2+vaep"}
    assert twinned.wanted("auto", "bfloat16") and not twinned.wanted("auto", "float32")
    assert twinned.wanted("only", "float32") and not twinned.wanted("off", "bfloat16")


def test_a_cache_row_is_judged_on_the_twin_by_its_caching_off_check():
    ok = {"status": "passed", "phase": "cache", "reasons": [], "proofs": [{"feature": "cache", "passed": True,
                                                                          "detail": "2 steps cached"}],
          "verdict": {"passed": False, "checks": [{"metric": "disp_rel_error", "passed": False, "value": 0.3,
                                                   "op": "<=", "threshold": 0.05}],
                      "cache_off": {"passed": True, "max_abs": 0.0, "detail": "max-abs 0"}}}
    assert twinned.verdict(ok)["status"] == "passed"  # the lossy gate on random weights does not count
    broken = json.loads(json.dumps(ok))
    broken["verdict"]["cache_off"] = {"passed": False, "max_abs": 0.03, "detail": "caching off differs by 0.03"}
    assert twinned.verdict(broken) == {"status": "failed", "reasons": ["caching off differs by 0.03"],
                                       "metrics": {"cache_off_max_abs": 0.03}}


@pytest.mark.full
def test_a_correct_plugin_passes_with_twin_rows_in_bf16(deep_wan, tmp_path):
    report = _run(Model.open(deep_wan, dtype="bfloat16", steps=4), "cp-ulysses-2,tp-2", tmp_path / "run", GOOD)
    assert report["passed"], [(r["name"], r["reasons"]) for r in report["rows"]]
    assert {r["name"]: r["twin"]["status"] for r in report["rows"] if r.get("twin")} == {
        "cp-ulysses-2": "passed", "tp-2": "passed"}


def test_twin_mode_is_checked(run_cli, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli("run", "zoo:flux", "--twin", "sometimes")
    assert exit_.value.code == 2 and "--twin" in capsys.readouterr().err
    with pytest.raises(DitgateError, match="--twin 'sometimes'"):
        run(RunConfig(model=Model.open("zoo:flux"), rows=[], twin="sometimes"))


@pytest.mark.full  # the twin's rows twice, once in a spawned process
def test_twin_beside_the_model_gives_the_record_it_gives_first(zoo_path, tmp_path):
    """On a GPU the twin runs beside the model's rows in a process of its own (no GPU visible there); the record it
    sends back is the one it gives when it runs first in the run's own process, and a twin whose process dies is
    inconclusive, never passed."""
    model = Model.open("zoo:flux", dtype="bfloat16", height=64, width=64, steps=3)
    cfg = RunConfig(model=model, rows=rows.select(rows.DEFAULT_ROWS, "cp-ulysses-2"), out=tmp_path, twin="auto")
    first = twinned.start(cfg, tmp_path / "first", run, lambda line: None, beside=False)()
    beside = twinned.start(cfg, tmp_path / "beside", run, lambda line: None, beside=True)()
    assert beside["beside"] and beside["waited_s"] >= 0 and first["status"] == beside["status"] == "ran"
    assert first["verdicts"] == beside["verdicts"] and beside["verdicts"]["cp-ulysses-2"]["status"] == "passed"
    broken = RunConfig(model=model, rows=cfg.rows, out=tmp_path, twin="auto", integration=tmp_path / "missing.py")
    record = twinned.start(broken, tmp_path / "broken", run, lambda line: None, beside=True)()
    assert record["status"] != "ran" or record["verdicts"]["cp-ulysses-2"]["status"] != "passed", record
