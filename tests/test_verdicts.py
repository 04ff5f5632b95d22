"""Verdicts that say what was proven: the baseline's step-to-step change of the transformer output, the
`inconclusive` status of a proven cache adapter on weights no cache can follow, advice ranked by evidence."""

from ditgate.core.model import Model
from ditgate.run.define import rows
from ditgate.run.exec import execute


def test_the_baseline_measures_how_fast_the_transformer_output_moves():
    model = Model.open("zoo:flux", steps=4)
    facts = execute.run_row(rows.BASELINE, model).facts
    change = facts["step_change"]["transformer"]
    assert len(change["values"]) == 3  # one per step after the first
    assert 0.0 < change["median"] <= change["max"] < 1.0
    cached = execute.run_row(rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE), model).facts
    assert "step_change" not in cached  # only uncached single-process rows measure it
