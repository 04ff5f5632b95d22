"""A row status for a gate that cannot judge: `inconclusive` (exit status 3), neither passed nor failed.

TinyMoE's correct adapter on weights initialised at four times the default scale (its blocks' weight matrices x4):
caching off, the adapter matches the baseline exactly, yet the cached residual changes by more than its own size
between steps (measured 1.15 against rules.residual_change 1.0) and the cache row misses the latent gate (disp_rel
0.197). That row is inconclusive, naming the change; the same weights with an adapter that changes the model fail on
the caching-off check, with the adapter named first and no cache tuning advised.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def volatile_moe(zoo_path, tmp_path_factory):
    from ditgate.core.model import Model

    source = Path(zoo_path("tinymoe"))
    out = tmp_path_factory.mktemp("volatile") / "tinymoe-x4"
    pipe = Model.open(str(source)).load("cpu")
    with torch.no_grad():
        for parameter in pipe.transformer.blocks.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(4.0)
    pipe.save_pretrained(out)
    shutil.copy(source / "ditgate.json", out / "ditgate.json")
    return out


def test_a_proven_adapter_on_volatile_weights_is_inconclusive(volatile_moe, run_cli, tmp_path):
    from ditgate.gates.verdicts import load_gates

    code, out, err = run_cli("run", volatile_moe, "--rows", "cache", "--out", tmp_path / "run", "--json",
                             "--integration", ROOT / "examples" / "tinymoe" / "integration.py")
    report = json.loads(out)
    cache = {r["name"]: r for r in report["rows"]}["cache"]
    assert code == 3 and report["outcome"] == "inconclusive" and not report["passed"], (code, err[-2000:])
    assert cache["status"] == "inconclusive", cache["reasons"]
    assert cache["verdict"]["cache_off"]["passed"] and cache["verdict"]["cache_off"]["max_abs"] == 0.0
    assert not cache["verdict"]["passed"] and cache["verdict"]["inconclusive"] == cache["reasons"][0]  # gate kept
    change = cache["reasons"][0]
    limit = load_gates()["rules"]["residual_change"]["value"]
    assert change.startswith("inconclusive") and "trained weights" in change and "%" in change, change
    assert not any("try a stricter threshold" in r for r in cache["reasons"])
    facts = json.loads((tmp_path / "run" / "rows" / "cache-cache-off" / "result.json").read_text())["facts"]
    measured = facts["residual_change"]["per_list"]["transformer.blocks"]["max"]
    assert measured > limit and f"{measured:.0%}" in change
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "verdict: **INCONCLUSIVE**" in markdown and "could not be judged" in markdown


def test_an_adapter_that_changes_the_model_fails_first_on_the_caching_off_check(volatile_moe, run_cli, tmp_path):
    plugin = ROOT / "tests" / "plugins" / "tinymoe_functor_changes_model.py"
    code, out, err = run_cli("run", volatile_moe, "--rows", "cache", "--out", tmp_path / "run", "--json",
                             "--integration", plugin)
    cache = {r["name"]: r for r in json.loads(out)["rows"]}["cache"]
    assert code == 1 and cache["status"] == "failed", (code, cache["reasons"], err[-2000:])
    assert not cache["verdict"]["cache_off"]["passed"]
    assert "caching off" in cache["reasons"][0] and "patch functor" in cache["reasons"][0], cache["reasons"]
    assert not any("try a stricter threshold" in r for r in cache["reasons"])
