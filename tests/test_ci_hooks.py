"""What a CI reads: `--junit FILE` on run, matrix and checklist (the file validates against the JUnit schema CI
servers read, tests/data/junit.xsd, holds one test case per row or checklist item, and a failed row's case carries
its reasons), and `--json` on every listing."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
XSD = ROOT / "tests" / "data" / "junit.xsd"


def _valid(path: Path) -> ET.Element:
    import xmlschema

    xmlschema.XMLSchema(XSD).validate(str(path))
    return ET.parse(path).getroot()


def _cases(root: ET.Element) -> dict[str, ET.Element]:
    return {case.get("name"): case for case in root.iter("testcase")}


def test_the_schema_refuses_what_ci_would_refuse(tmp_path):
    import xmlschema

    bad = tmp_path / "bad.xml"
    bad.write_text('<testsuites><testsuite tests="1"><testcase name="x"><failure/></testcase></testsuite></testsuites>')
    with pytest.raises(xmlschema.XMLSchemaValidationError):  # a suite without its name
        xmlschema.XMLSchema(XSD).validate(str(bad))


def test_run_junit_has_a_case_per_row_and_the_failure_reason(run_cli, tmp_path):
    code, out, err = run_cli("run", "zoo:flux", "--rows", "cp-ulysses-2", "--integration",
                             ROOT / "tests" / "plugins" / "flux_cp_rope_restarted.py", "--no-diff", "--twin", "off",
                             "--out", tmp_path / "run", "--junit", tmp_path / "run.xml", "-q")
    assert code == 1
    root = _valid(tmp_path / "run.xml")
    cases = _cases(root)
    assert {"baseline", "cp-ulysses-2"} <= set(cases)
    failure = cases["cp-ulysses-2"].find("failure")
    assert failure is not None and failure.get("message")
    import json

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    row = next(r for r in report["rows"] if r["name"] == "cp-ulysses-2")
    assert failure.get("message") == "; ".join(row["reasons"])
    assert cases["baseline"].find("failure") is None and cases["baseline"].find("error") is None
    suite = root.find("testsuite")
    assert int(suite.get("tests")) == len(report["rows"]) and int(suite.get("failures")) >= 1
    assert "failed" in out.lower() or "FAIL" in out  # -q shows the output of a failure


def test_checklist_junit_has_a_case_per_item(run_cli, tmp_path, flux_default_run):
    import json

    _, run_dir = flux_default_run
    code, out, err = run_cli("checklist", "cache", "--model", "zoo:flux", "--from-run", run_dir, "--out",
                             tmp_path / "cl", "--junit", tmp_path / "cl.xml", "--json")
    filled = json.loads(out)
    root = _valid(tmp_path / "cl.xml")
    items = [item for checklist in filled for item in checklist["items"]]
    cases = list(root.iter("testcase"))
    assert [c.get("name") for c in cases] == [i["id"] for i in items]
    manual = [i for i in items if i["result"]["status"] == "manual"]
    assert len(list(root.iter("skipped"))) == len(manual) > 0
    assert code == (0 if all(i["result"]["status"] in ("pass", "manual") for i in items) else 1)


@pytest.mark.full
def test_matrix_junit(run_cli, tmp_path):
    code, out, err = run_cli("matrix", "zoo:flux", "--rows", "cache-fast", "--repeats", "1", "--warmup", "0",
                             "--out", tmp_path / "m", "--junit", tmp_path / "m.xml", "-q")
    root = _valid(tmp_path / "m.xml")
    assert "cache-fast" in _cases(root) and code == 0


@pytest.mark.parametrize("argv, key", [
    (["zoo", "list"], "name"), (["zoo", "list", "--pipelines"], "pipeline"), (["notebook", "list"], "parameters"),
    (["run", "zoo:flux", "--list-rows"], "name"), (["checklist", "--validate"], "items"),
    (["checklist", "--list-checks"], "summary"), (["lint", "--list-rules"], "severity")])
def test_every_listing_prints_json(run_cli, argv, key):
    import json

    code, out, err = run_cli(*argv, "--json")
    listed = json.loads(out)
    assert code == 0 and isinstance(listed, list) and len(listed) > 1 and all(key in entry for entry in listed)
    code, text, err = run_cli(*argv)
    assert code == 0 and not text.lstrip().startswith("[")
