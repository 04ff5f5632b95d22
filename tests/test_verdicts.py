"""Verdicts that say what was proven: the power of each gate, the smallest perturbation of the transformer's
output it rejects (ditgate.run.judge.discrimination)."""


def test_gates_state_their_power(flux_default_run):
    """Every gated row's gate is checked against the baseline with every transformer output perturbed by the size of
    the smallest planted fault (gates.json rules.sensitivity.fault_size): the exact gates reject it (their power is a
    fault of realistic size), the lossy cache gate does not and is checked against the coarse perturbation, and
    report.md states each row's power."""
    from ditgate.gates.verdicts import load_gates

    rule = load_gates()["rules"]["sensitivity"]
    report, out = flux_default_run
    power = {r["name"]: r["verdict"]["discriminates"] for r in report["rows"] if r.get("phase")}
    exact = [n for n in power if n != "cache"]
    assert len(exact) == 7 and all(power[n]["passed"] and power[n]["power"] == rule["fault_size"] for n in exact), power
    assert power["cache"]["passed"] and power["cache"]["power"] == rule["coarse"]
    assert "coarser than a fault of realistic size" in power["cache"]["detail"]
    text = (out / "report.md").read_text()
    assert "## Power of the gates" in text and "| cp-ulysses-2 | cp | 0.004 | rejected (s = 0.004) |" in text
