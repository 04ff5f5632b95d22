"""Machine output is pure, and a run says what happened: library logs never reach stdout under --json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.full
def test_run_json_stdout_is_only_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "ditgate", "run", "zoo:flux", "--rows", "cache", "--out",
                           str(tmp_path / "run"), "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert report["passed"] and "[Cache-DiT]" in done.stderr


@pytest.mark.full
def test_diff_json_stdout_is_only_json(tmp_path):
    """The probe's case: `ditgate diff --json` printed cache-dit's log lines before the JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    plugin = Path(__file__).parent / "plugins" / "flux_cp_rope_restarted.py"
    done = subprocess.run([sys.executable, "-m", "ditgate", "diff", "zoo:flux", "--row", "cp-ulysses-2",
                           "--integration", str(plugin), "--out", str(tmp_path / "diff"), "--json"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-3000:]  # the fault is found
    found = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert found["row"] == "cp-ulysses-2"


def test_a_gate_that_cannot_discriminate_never_passes(run_cli, zoo_path, tmp_path):
    """Planted fault: a transformer whose output layer is zero outputs zeros, so every row matches the baseline
    at max-abs 0. The sensitivity row shows the gate passes an output perturbed far outside it, and the row fails."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "flux-zero"
    shutil.copytree(zoo_path("zoo:flux"), model)
    weights = model / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    for name in ("proj_out.weight", "proj_out.bias"):
        tensors[name].zero_()
    save_file(tensors, weights)
    code, out, err = run_cli("run", model, "--rows", "cache", "--out", tmp_path / "run", "--json")
    assert code == 1, err[-3000:]
    cache = {r["name"]: r for r in json.loads(out)["rows"]}["cache"]
    assert cache["status"] == "failed" and cache["verdict"]["discriminates"]["passed"] is False
    assert any("cannot discriminate" in reason for reason in cache["reasons"]), cache["reasons"]
    assert cache["metrics"]["max_abs"] == 0  # the fault shows: the cached output equals the baseline exactly


def test_rows_against_a_failed_baseline_are_not_launched(run_cli, tmp_path):
    """A baseline that fails leaves nothing to compare with: the rows that compare with it are not run (not even
    launched), and say why."""
    rows = tmp_path / "rows.yaml"
    rows.write_text("- {name: base-bad, baseline: null, cache: {Fn_compute_blocks: 1, not_a_field: 3}}\n"
                    "- {name: cp, phase: cp, baseline: base-bad, parallel: {ulysses_size: 2}}\n")
    code, out, err = run_cli("run", "zoo:flux", "--rows-file", rows, "--out", tmp_path / "run", "--json")
    assert code == 1, err[-3000:]
    by_name = {r["name"]: r for r in json.loads(out)["rows"]}
    assert by_name["base-bad"]["status"] == "error"
    assert "baseline row 'base-bad' failed" in by_name["cp"]["reasons"][0]
    assert not (tmp_path / "run" / "groups").exists()  # no worker group was started


def test_hints_name_the_component_that_failed():
    from ditgate.run.judge.hints import HINTS, hint_for

    assert hint_for("tep", "ValueError: no TP planner for FluxTransformer2DModel") == HINTS["tp"]
    assert hint_for("tep", "no text-encoder planner for T5EncoderModel") == HINTS["tep"]
    assert hint_for("vaep", "AutoencoderKL has no VAE planner") == HINTS["vaep"]
    assert hint_for("cp", "rank 1 was killed by SIGKILL in row 'x' at stage 'generate'") == ""
    assert hint_for("cp", "not run: 3 ranks", {"preflight": True}) == ""


def test_speedups_above_their_ideal_or_without_warm_up_are_marked():
    from ditgate.run.define import rows
    from ditgate.run.define.predict import caveats

    row = rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE)
    result = {"facts": {"transformer_calls": 28, "cache": [{"cached_steps": list(range(13))}]}}  # ideal 28/15
    gpu_warm = (1, "cuda")
    assert caveats(row, result, 1.80, *gpu_warm) == []
    above = caveats(row, result, 2.83, *gpu_warm)  # the H200's cold-baseline number
    assert len(above) == 1 and above[0].startswith("not meaningful") and "1.87x" in above[0]
    assert any("without warm-up" in c for c in caveats(row, result, 1.5, 0, "cuda"))
    hybrid = rows.Row("h", "hybrid", parallel={"ulysses_size": 2, "tp_size": 2})
    cpu = caveats(hybrid, {"facts": {"transformer_calls": 8}}, 1.1, 1, "cpu")
    assert any("oversubscribed" in c for c in cpu) == (4 > len(__import__("os").sched_getaffinity(0)))
    assert caveats(rows.BASELINE, result, 1.0, *gpu_warm) == []


def test_the_cache_row_checks_the_adapter_with_caching_off(run_cli, tmp_path):
    """Planted fault: a patch functor that scales every double block's output. Caching off, the adapter's latents
    must match the baseline's by the tensor rule; here they do not, and the cache row fails naming the adapter."""
    plugin = Path(__file__).parent / "plugins" / "flux_functor_changes_model.py"
    code, out, err = run_cli("run", "zoo:flux", "--rows", "cache", "--out", tmp_path / "run", "--json",
                             "--integration", plugin)
    assert code == 1, err[-3000:]
    cache = {r["name"]: r for r in json.loads(out)["rows"]}["cache"]
    assert cache["verdict"]["cache_off"]["passed"] is False and cache["verdict"]["cache_off"]["max_abs"] > 1e-4
    assert any("caching off" in reason and "patch functor" in reason for reason in cache["reasons"])
    assert "caching off" in cache["reasons"][0], cache["reasons"]  # the strongest evidence first, no cache tuning
    assert "patch functor ScalingFunctor" in cache["reasons"][0]  # named: the plugin's functor, not a threshold
    assert not any("try a stricter threshold" in reason for reason in cache["reasons"])


def test_a_nan_baseline_fails_the_rows_and_writes_the_report(run_cli, tmp_path):
    """A call that makes the baseline NaN (a NaN sigma): every compared row fails with the reason, the report is
    written, exit 1 (it used to end in exit 2 'baseline contains NaN' with no report after every row ran)."""
    out = tmp_path / "run"
    code, _, err = run_cli("run", "zoo:flux", "--rows", "cache", "--steps", "4", "--call",
                           "sigmas=[NaN, 0.5, 0.3, 0.1]", "--out", out)
    report = json.loads((out / "report.json").read_text())
    row = next(r for r in report["rows"] if r["name"] == "cache")
    assert code == 1 and not report["passed"] and row["status"] == "failed", err[-1500:]
    assert any("baseline contains NaN" in reason for reason in row["reasons"]), row["reasons"]
    assert (out / "report.md").is_file()
