"""The cache proof reads every block of a list, not only the last: with Bn_compute_blocks > 0 cache-dit computes the
last blocks on every step and skips the middle ones, so "the last block ran on every call" is no evidence that
nothing was cached (the proof used to say the cache did not act)."""

import json


def test_the_cache_proof_holds_with_back_blocks_computed(run_cli, tmp_path):
    code, out, err = run_cli("run", "zoo:wan", "--rows", "cache", "--out", tmp_path / "run", "--json",
                             "--cache-config", "Fn_compute_blocks=1", "Bn_compute_blocks=1")
    cache = {r["name"]: r for r in json.loads(out)["rows"]}["cache"]
    proof = next(p for p in cache["proofs"] if p["feature"] == "cache")
    assert proof["passed"], proof["detail"]
    assert "blocks.1" in proof["detail"] or "blocks" in proof["detail"]
    facts = json.loads((tmp_path / "run" / "rows" / "cache" / "result.json").read_text())["facts"]
    assert facts["last_block_calls"]["transformer.blocks"] == facts["transformer_calls"]  # the last block always ran
    assert min(facts["block_calls"]["transformer.blocks"]) < facts["transformer_calls"]  # a middle block did not


def test_the_cache_checklist_takes_the_cache_config(run_cli, tmp_path):
    """`ditgate checklist` takes --cache-config as `run` does: the cache rows (and the every-step check) run with it,
    so a cache phase that needs its own schedule can be done (F1B1 on zoo:wan passes its proof with it)."""
    code, out, err = run_cli("checklist", "cache", "--model", "zoo:wan", "--out", tmp_path / "cl", "--json",
                             "--cache-config", "Fn_compute_blocks=1", "Bn_compute_blocks=1")
    (filled,) = json.loads(out)
    item = next(i for i in filled["items"] if i["check"].get("row") == "cache")
    assert item["result"]["status"] == "pass", item["result"]["evidence"]
    report = json.loads((tmp_path / "cl" / "report.json").read_text())
    configs = {r["name"]: r["config"]["cache"] for r in report["rows"] if r["config"]["cache"]}
    assert configs["cache"]["Bn_compute_blocks"] == 1 and configs["cache-all-steps"]["Bn_compute_blocks"] == 1
    code, _, err = run_cli("checklist", "cache", "--model", "zoo:wan", "--cache-config", "nonsense=1")
    assert code == 2 and "nonsense" in err
