"""Every transformer the pipeline calls is covered: on Wan 2.2's two-expert pipeline (zoo:pipe/wan22, diffusers'
WanPipeline with `transformer` before the boundary step and `transformer_2` after it), a plugin whose cache, CP and
TP act on the first expert only (its BlockAdapter lists one) fails the three rows with both transformers and the steps they serve named; the same plugin
declaring the second `NOT_COVERED` passes with it reported "not covered"; a plugin covering both passes."""

import json
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parent / "plugins"
pytestmark = pytest.mark.full  # three runs of two rows on a two-transformer video pipeline (about a minute each)


def _rows(run_cli, tmp_path, plugin, rows="cache,cp-ulysses-2"):
    code, out, err = run_cli("run", "zoo:pipe/wan22", "--rows", rows, "--twin", "off", "--steps", "8",
                             "--integration", PLUGINS / plugin, "--out", tmp_path / plugin, "--json")
    return code, {r["name"]: r for r in json.loads(out)["rows"]}


def _proof(row, feature):
    return next(p for p in row["proofs"] if p["feature"] == feature)


def test_caching_and_splitting_one_of_two_transformers_fails_naming_both(run_cli, tmp_path):
    code, rows = _rows(run_cli, tmp_path, "wan22_one_transformer.py", "cache,cp-ulysses-2,tp-2")
    assert code == 1
    for name, feature in (("cache", "cache"), ("cp-ulysses-2", "cp"), ("tp-2", "tp")):
        row, proof = rows[name], _proof(rows[name], feature)
        assert row["status"] == "failed" and not proof["passed"], proof
        assert proof["coverage"] == {"transformer": "acted", "transformer_2": "did not act"}
        assert f"{feature} acted on transformer (" in proof["detail"] and "and not on transformer_2 (" in \
            proof["detail"], proof["detail"]
        assert "steps" in proof["detail"] and f'NOT_COVERED = {{"{feature}": ["transformer_2"]}}' in proof["detail"]
        assert any(r.startswith(f"{feature} left a transformer out") for r in row["reasons"]), row["reasons"]
        assert row["acted"][feature]["transformers"]["transformer_2"] == "did not act"
    # the CP row's output matches the baseline: only the proof tells that transformer_2 ran whole on every rank
    assert rows["cp-ulysses-2"]["metrics"]["max_abs"] == 0.0
    assert "transformer_2.blocks: 8 tokens per rank, expected 4" in _proof(rows["cp-ulysses-2"], "cp")["detail"]
    report = (tmp_path / "wan22_one_transformer.py" / "report.md").read_text()
    assert "cp: ACTED ON PART (a transformer left out)" in report


def test_a_transformer_declared_not_covered_is_reported_so(run_cli, tmp_path):
    code, rows = _rows(run_cli, tmp_path, "wan22_one_declared.py")
    assert code == 0, {n: r["reasons"] for n, r in rows.items()}
    for name, feature in (("cache", "cache"), ("cp-ulysses-2", "cp")):
        proof = _proof(rows[name], feature)
        assert proof["passed"] and proof["coverage"] == {"transformer": "acted", "transformer_2": "not covered"}
        assert proof["detail"].endswith("not covered (declared in NOT_COVERED): transformer_2"), proof["detail"]


def test_a_plugin_covering_both_transformers_passes(run_cli, tmp_path):
    code, rows = _rows(run_cli, tmp_path, "wan22_both.py")
    assert code == 0, {n: r["reasons"] for n, r in rows.items()}
    for name, feature in (("cache", "cache"), ("cp-ulysses-2", "cp")):
        proof = _proof(rows[name], feature)
        assert proof["passed"] and set(proof["coverage"].values()) == {"acted"}, proof
        assert "transformer_2 (" in proof["detail"], proof["detail"]
