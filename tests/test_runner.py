"""The phase runner on real cache-dit and real torchrun (gloo on CPU)."""

import json
from pathlib import Path

import jsonschema
import pytest

from ditgate import zoo
from ditgate.core import request
from ditgate.run.define import rows
from ditgate.run.exec import files as store
from ditgate.core.paths import checklists_dir
from ditgate.core.model import Model
from ditgate.run.runner import RunConfig, RunFolderError, run

PLUGINS = Path(__file__).parent / "plugins"
DEFAULT = {r.name: r for r in rows.DEFAULT_ROWS}


def _run(model, names, out, dtype="auto", **kwargs):
    cfg = RunConfig(model=Model.open(model, dtype=dtype), rows=rows.select(rows.DEFAULT_ROWS, names), out=out,
                    **kwargs)
    return run(cfg, progress=lambda line: None)


def _rows(report):
    return {r["name"]: r for r in report["rows"]}


@pytest.fixture(scope="module")
def flux_report(flux_default_run):
    return flux_default_run[0]  # every default row on zoo:flux (tests/conftest.py)


def test_default_rows_pass_on_flux(flux_report):
    by_name = _rows(flux_report)
    assert list(by_name) == ["baseline", "cache", "cp-ulysses-2", "cp-ring-2", "tp-2", "tp-2+tep", "baseline-tiled",
                             "tp-2+vaep", "cache+ulysses-2", "hybrid-u2xtp2"]
    failed = {n: r["reasons"] for n, r in by_name.items() if r["status"] not in ("passed", "reference")}
    assert not failed, failed
    assert flux_report["passed"]


def test_report_says_where_the_time_went(flux_default_run):
    """Per row its generations and overhead by kind; the run's total counts the check rows' generations (the
    sensitivity rows and the cache-off twin, run but not shown) as generations, not as overhead."""
    report, out = flux_default_run
    t, shown = report["time"], [r for r in report["rows"] if r.get("generate_s") is not None]
    assert len(shown) == 10 and all(set(r["overhead"]) >= {"launch_s", "load_s", "restore_s", "setup_s"} for r in shown)
    assert sum(r["overhead"]["load_s"] for r in shown) > 0  # the one load, paid by the first row
    assert [r["name"] for r in shown if r["overhead"]["launch_s"] > 0] == ["cp-ulysses-2", "hybrid-u2xtp2"]  # 2 groups
    checks = [store.load_result(out, name) for name in ("sensitivity-fault-size", "sensitivity", "cache-cache-off")]
    assert t["checks_s"] == pytest.approx(sum(c["generate_s"] for c in checks), abs=2e-3) and t["checks_s"] > 0
    assert t["generate_s"] == pytest.approx(sum(r["generate_s"] for r in shown) + t["checks_s"], abs=2e-3)
    assert t["overhead_s"] == pytest.approx(report["wall_s"] - t["generate_s"], abs=2e-3)
    text = (out / "report.md").read_text()
    assert "## Where the time went" in text and "sensitivity and cache-off twins" in text


def test_each_feature_proves_it_acted(flux_report):
    by_name = _rows(flux_report)
    features = {n: {p["feature"]: p["passed"] for p in r["proofs"]} for n, r in by_name.items()}
    assert features["cache"] == {"cache": True}
    assert features["cp-ulysses-2"] == features["cp-ring-2"] == {"cp": True}
    assert features["tp-2+tep"] == {"tp": True, "tep": True}
    assert features["tp-2+vaep"] == {"tp": True, "vaep": True}
    assert features["cache+ulysses-2"] == {"cache": True, "cp": True}
    assert features["hybrid-u2xtp2"] == {"cp": True, "tp": True}
    facts = by_name["cache"]["facts"]
    assert facts["cache"][0]["cached_steps"] == [2, 4, 6]  # the static schedule: warm-up 2, then every other step
    assert facts["last_block_calls"]["transformer.single_transformer_blocks"] == 5  # 8 steps, 3 skipped
    # tokens leaving the first double block: 1024 image + 32 text, split in two
    assert by_name["cp-ulysses-2"]["facts"]["block_seq_len"]["transformer.transformer_blocks"] == 528


def test_exact_rows_match_the_baseline_latents(flux_report):
    for name, r in _rows(flux_report).items():
        if r["phase"] in ("cp", "tp", "tep", "vaep", "hybrid"):
            assert r["metrics"]["max_abs"] <= 1e-4, (name, r["metrics"])


def test_report_files(flux_report):
    run_dir = Path(flux_report["run_dir"])
    on_disk = json.loads((run_dir / "report.json").read_text())
    jsonschema.validate(on_disk, json.loads((checklists_dir() / "report.schema.json").read_text()))
    table = (run_dir / "report.md").read_text()
    for name in DEFAULT:
        assert f"| {name} |" in table
    assert "**PASS**" in table
    from PIL import Image

    grid = Image.open(run_dir / "grid.png")
    assert grid.width >= 10 * 128 and grid.height >= 2 * 128  # every row, outputs over differences
    assert not list(run_dir.rglob(".*.tmp")) and not list(run_dir.rglob(".result.json.*"))


def test_default_rows_pass_on_wan(wan_default_run):
    report = wan_default_run[0]
    failed = {r["name"]: r["reasons"] for r in report["rows"] if r["status"] not in ("passed", "reference")}
    assert not failed, failed
    assert _rows(report)["cache"]["modality"] == "video"


def test_cache_rows_with_true_cfg_pass_on_qwen_image(tmp_path):
    report = _run("zoo:qwen-image", "cache,cache+ulysses-2", tmp_path / "run")
    by_name = _rows(report)
    assert report["passed"], {n: r["reasons"] for n, r in by_name.items()}
    assert by_name["baseline"]["facts"]["calls_per_step"] == 2.0  # separate conditional and unconditional calls
    stats = by_name["cache"]["facts"]["cache"][0]
    assert stats["cached_steps"] and stats["cfg_cached_steps"] == stats["cached_steps"]


def test_good_plugin_is_used(tmp_path):
    report = _run("zoo:flux", "cache,cp-ulysses-2,tp-2", tmp_path / "run", integration=PLUGINS / "flux_good.py")
    by_name = _rows(report)
    assert report["passed"], {n: r["reasons"] for n, r in by_name.items()}
    # the plugin shards only the feed-forward layers of the 2 double blocks: per block, 2 column-wise layers (weight
    # and bias sharded) and 2 row-wise layers (weight sharded, bias replicated)
    assert by_name["tp-2"]["facts"]["sharded"]["transformer"]["sharded"] == 2 * (2 * 2 + 2)


@pytest.mark.parametrize("plugin, row, words", [
    ("flux_cp_no_gather.py", "cp-ulysses-2", ["_ContextParallelOutput", "gather"]),
    ("flux_tp_heads_not_divided.py", "tp-2", ["shard_div_attr"]),
    ("flux_wrong_pattern.py", "cache", ["ForwardPattern"]),
])
def test_broken_integrations_fail_with_a_useful_reason(tmp_path, plugin, row, words):
    report = _run("zoo:flux", row, tmp_path / "run", integration=PLUGINS / plugin)
    result = _rows(report)[row]
    assert not report["passed"] and result["status"] in ("failed", "error")
    reasons = " ".join(result["reasons"])
    for word in words:
        assert word in reasons, reasons


def _fails_alone(report, failed="cp-ulysses-2", after="cp-ring-2"):
    """`failed` is an error with its reason, the row after it in the same world size passed (its group restarted)."""
    by_name = _rows(report)
    assert by_name[failed]["status"] == "error"
    assert by_name[after]["status"] == "passed", by_name[after]["reasons"]
    return by_name[failed]


def test_crashed_rank_is_named(tmp_path):
    report = _run("zoo:flux", "cp-ulysses-2,cp-ring-2", tmp_path / "run",
                  integration=PLUGINS / "flux_rank1_crashes.py")
    result = _fails_alone(report)
    assert "rank 1 failed in row 'cp-ulysses-2' at stage 'apply': RuntimeError: planted failure on rank 1" in \
        result["reasons"][0]
    ranks = {r["rank"]: r for r in result["error"]["ranks"]}
    assert "planted failure" in ranks[1]["traceback"]


def test_killed_rank_is_named(tmp_path):
    report = _run("zoo:flux", "cp-ulysses-2,cp-ring-2", tmp_path / "run", integration=PLUGINS / "flux_rank1_killed.py")
    result = _fails_alone(report)
    assert "rank 1 was killed by SIGKILL in row 'cp-ulysses-2' at stage 'apply'" in result["reasons"][0]


@pytest.mark.full
def test_hung_rank_ends_in_a_report(tmp_path):
    report = _run("zoo:flux", "cp-ulysses-2,cp-ring-2", tmp_path / "run", integration=PLUGINS / "flux_rank1_hangs.py",
                  timeout=30)
    result = _fails_alone(report)
    assert result["error"]["timed_out"]
    assert "no progress" in result["reasons"][0]
    assert "rank 1 in row 'cp-ulysses-2' at stage 'apply'" in result["reasons"][0]
    assert "a rank hung" in result["reasons"][0] and "check the CP plan" not in result["reasons"][0]


def test_resume_keeps_finished_rows(tmp_path):
    out = tmp_path / "run"
    first = _run("zoo:flux", "cache", out)
    stamp = (out / "rows" / "cache" / "result.json").stat().st_mtime_ns
    with pytest.raises(RunFolderError, match="--resume"):
        _run("zoo:flux", "cache", out)
    again = _run("zoo:flux", "cache", out, resume=True)
    assert (out / "rows" / "cache" / "result.json").stat().st_mtime_ns == stamp
    assert all(r["resumed"] for r in again["rows"])
    assert _rows(again)["cache"]["metrics"] == _rows(first)["cache"]["metrics"]
    with pytest.raises(RunFolderError, match="dtype"):
        _run("zoo:flux", "cache", out, resume=True, dtype="bfloat16")


def test_preflight_refuses_indivisible_heads_before_loading(tmp_path):
    three = rows.Row("tp-3", "tp", parallel={"tp_size": 3})
    cfg = RunConfig(model=Model.open("zoo:flux"), rows=rows.select([three], None), out=tmp_path / "run")
    report = run(cfg, progress=lambda line: None)
    result = _rows(report)["tp-3"]
    assert result["status"] == "error"
    assert "4 attention heads, which 3 tensor-parallel ranks do not divide" in result["reasons"][0]


def test_cli_run_exit_codes(run_cli, tmp_path):
    code, out, _ = run_cli("run", "zoo:flux", "--rows", "cache", "--out", tmp_path / "ok")
    assert code == 0 and "| cache | cache | 1 |" in out
    code, out, _ = run_cli("run", "zoo:flux", "--rows", "cache", "--out", tmp_path / "bad",
                           "--integration", PLUGINS / "flux_wrong_pattern.py", "--json")
    assert code == 1 and json.loads(out)["passed"] is False
    code, out, _ = run_cli("run", "zoo:flux", "--list-rows")
    assert code == 0 and "hybrid-u2xtp2" in out and "ranks=4" in out
    code, _, err = run_cli("run", "zoo:flux", "--rows", "warp")
    assert code == 2 and "unknown row" in err
