"""Progress lines of a run: the total is known at the start and never changes, a worker group prints a start line
and a heartbeat with each rank's stage, resumed rows say "reused", and a reason is never cut mid-word."""

from __future__ import annotations

import re

from ditgate.run import progress


def _run(out, rows, resume=False):
    from ditgate.core.model import Model
    from ditgate.run.runner import RunConfig, run

    lines: list[str] = []
    report = run(RunConfig(model=Model.open("zoo:flux"), rows=rows, out=out, resume=resume, twin="off"),
                 progress=lines.append)
    return report, lines


def test_total_start_line_heartbeat_and_reused(tmp_path, monkeypatch):
    from ditgate.run.define import rows
    from ditgate.run.define.rows import Row

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.05)
    chosen = rows.select(rows.DEFAULT_ROWS, "cache,cp-ulysses-2") + [
        Row("cp-ulysses-3", phase="cp", baseline="baseline", parallel={"ulysses_size": 3})]
    report, lines = _run(tmp_path / "run", chosen)
    counted = [re.match(r"\[ *(\d+)/(\d+)\]", line) for line in lines]
    counted = [m for m in counted if m]
    totals = {int(m.group(2)) for m in counted}
    # known at the start, never grew: every row the run recorded (its own sensitivity and caching-off rows too)
    assert totals == {len(counted)} and len(counted) >= len(report["rows"]) + 2, lines
    assert [int(m.group(1)) for m in counted] == list(range(1, len(counted) + 1))
    assert any(line.strip() == "starting 2 ranks for cp-ulysses-2" for line in lines), lines
    beats = [line for line in lines if "running on 2 ranks" in line]
    assert beats and "rank 0:" in beats[0] and "rank 1:" in beats[0], lines
    refused = next(line for line in lines if "cp-ulysses-3" in line and "ERROR" in line)
    reason = next(r for r in report["rows"] if r["name"] == "cp-ulysses-3")["error"]["message"]
    shown = refused.split("ERROR ", 1)[1].removesuffix(" ...")
    assert " ".join(reason.split()).startswith(shown)
    words = " ".join(reason.split()).split(" ")
    assert shown.split(" ")[-1] in words  # the last word shown is a whole word of the reason

    again, lines = _run(tmp_path / "run", chosen, resume=True)
    finished = [line for line in lines if re.match(r"\[ *\d+/\d+\]", line) and "ERROR" not in line]
    assert finished and all("reused" in line for line in finished), lines


def test_shorten_cuts_between_words():
    text = "the preflight refused this row because " + "/a/very/long/path/segment " * 20
    short = progress.shorten(text, 80)
    assert len(short) <= 80 and short.endswith(" ...")
    assert all(word in text.split() for word in short.removesuffix(" ...").split())
    assert progress.shorten("one\nline  only") == "one line only"


def test_planned_counts_the_rows_the_runner_adds():
    from ditgate.run.define import rows

    chosen = rows.select(rows.DEFAULT_ROWS, "cache")  # baseline, cache
    # + the coarse sensitivity row (the cache gate is lossy) + the caching-off twin; in bf16 also the calibration row
    assert progress.planned(chosen, 8, "float32", "diffusers.FluxPipeline", None) == 4
    assert progress.planned(chosen, 8, "bfloat16", "diffusers.FluxPipeline", None) == 5
    assert progress.planned(chosen, 8, "float32", "diffusers.StableAudioPipeline", None) == 5
    both = rows.select(rows.DEFAULT_ROWS, "cache,tp-2")  # an exact gate too: the fault-sized row as well
    assert progress.planned(both, 8, "float32", "diffusers.FluxPipeline", None) == 6
    cp = rows.select(rows.DEFAULT_ROWS, "cp-ulysses-2")  # an exact gate in float32: the fault-sized row alone
    assert progress.planned(cp, 8, "float32", "diffusers.FluxPipeline", None) == 3
    assert progress.planned(cp, 8, "bfloat16", "diffusers.FluxPipeline", None) == 5  # + coarse + calibration
    assert progress.planned(rows.select(rows.DEFAULT_ROWS, "baseline"), 8, "float32", None, None) == 1
