"""--prompts / --seeds: a lossy row judged on several prompts and seeds, each gate on its worst case, the spread in
report.md; repeats as min / median / max."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(out: Path, prompts: list[str], seeds: int, gates: Path | None = None, resume: bool = False):
    from ditgate.core.model import Model
    from ditgate.run.define import rows, variants
    from ditgate.run.runner import RunConfig, run

    model = Model.open("zoo:flux")
    from ditgate.gates.verdicts import load_gates

    chosen = variants.expand(rows.select(rows.DEFAULT_ROWS, "cache"), prompts, seeds, model.request.seed,
                             load_gates())
    return run(RunConfig(model=model, rows=chosen, out=out, gates=gates, resume=resume, repeats=2, twin="off"),
               progress=lambda line: None)


@pytest.mark.full  # ~30 s of the fast tier; the variants' parsing and selection stay fast
def test_each_gate_on_the_worst_case(tmp_path):
    out = tmp_path / "run"
    report = _run(out, ["a lighthouse on a cliff at dusk"], 1)  # one more case: the fast tier's budget
    by_name = {r["name"]: r for r in report["rows"]}
    cases = ["cache", "cache@p1s0"]
    assert set(cases) <= set(by_name) and "baseline@p1s0" in by_name
    # the variant really ran on the other prompt: its baseline differs from the request's
    base = np.load(out / "rows" / "baseline" / "output.npy")
    for other in ("baseline@p1s0",):
        assert np.abs(np.load(out / "rows" / other / "output.npy") - base).max() > 0.01
    psnr = {name: by_name[name]["metrics"]["psnr"] for name in cases}
    cache = by_name["cache"]
    check = next(c for c in cache["verdict"]["checks"] if c["metric"] == "psnr")
    assert check["value"] == min(psnr.values()) and check["worst_case"] == min(psnr, key=psnr.get)
    assert check["spread"]["max"] == max(psnr.values()) and cache["status"] == "passed"
    text = (out / "report.md").read_text()
    assert "## Prompts and seeds (each gate on the worst case)" in text and "| cache | 2 | psnr |" in text
    assert "## Latency over repeats (s)" in text and "| cache | 2 |" in text

    # a threshold between the request's own PSNR and the worst case: the row alone would pass, its worst case fails
    if psnr["cache"] - min(psnr.values()) < 1e-3:
        pytest.skip("the variants' PSNR equals the request's; nothing to place a threshold between")
    table = json.loads((ROOT / "checklists" / "gates.json").read_text())
    for c in table["phases"]["cache"]["modalities"]["image"]["checks"]:
        if c["metric"] == "psnr":
            c["value"] = (psnr["cache"] + min(psnr.values())) / 2
    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps(table))
    again = {r["name"]: r for r in _run(out, ["a lighthouse on a cliff at dusk"], 1, gates=strict,
                                        resume=True)["rows"]}
    assert all(again[name]["resumed"] for name in cases)  # judged again, not run again
    assert again["cache"]["status"] == "failed"
    worst = min(psnr, key=psnr.get)
    assert any(reason.startswith(f"on {worst} ") and "PSNR" in reason for reason in again["cache"]["reasons"])


def test_prompts_file_forms(tmp_path):
    from ditgate.core.errors import DitgateError
    from ditgate.run.define import variants

    (tmp_path / "p.txt").write_text("# a comment\nfirst prompt\n\nsecond prompt\n")
    assert variants.read_prompts(tmp_path / "p.txt") == ["first prompt", "second prompt"]
    (tmp_path / "p.json").write_text('["one", "two"]')
    assert variants.read_prompts(tmp_path / "p.json") == ["one", "two"]
    (tmp_path / "bad.yaml").write_text("prompt: one\n")
    with pytest.raises(DitgateError, match="a list of non-empty strings"):
        variants.read_prompts(tmp_path / "bad.yaml")
    with pytest.raises(DitgateError, match="does not exist"):
        variants.read_prompts(tmp_path / "none.txt")


def test_only_lossy_rows_get_variants():
    from ditgate.gates.verdicts import load_gates
    from ditgate.run.define import rows, variants

    chosen = rows.select(rows.DEFAULT_ROWS, "cache,cp-ulysses-2")
    names = [r.name for r in variants.expand(chosen, None, 2, 0, load_gates())]
    assert "cache@p0s1" in names and "baseline@p0s1" in names
    assert not any(n.startswith("cp-ulysses-2@") for n in names)  # an exact row is exact on every prompt
    assert variants.expand(chosen, None, 1, 0, load_gates()) == chosen


def test_cli_refuses_a_missing_prompts_file(run_cli, tmp_path):
    code, out, err = run_cli("run", "zoo:flux", "--rows", "cache", "--prompts", tmp_path / "nope.txt")
    assert code == 2 and "does not exist" in err and err.count("\n") == 1
