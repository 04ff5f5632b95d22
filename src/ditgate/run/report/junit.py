"""JUnit XML for a CI to read (`--junit FILE` on run, matrix and checklist): one test case per row or checklist item,
its failure's message the reasons the report gives.

The file follows the format Jenkins, GitLab, GitHub Actions' test reporters and pytest's `--junitxml` share: one
`<testsuites>` holding one `<testsuite>` per command, one `<testcase name= classname= time=>` per row with a
`<failure>`, `<error>` or `<skipped>` child when it did not pass. A reference row (a baseline) passes with what it
produced in `<system-out>`; a row the preflight refused is skipped with the reason; a manual checklist item is
skipped ("to check by hand"). Written whole or not at all.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ditgate.core.errors import DitgateError
from ditgate.run.exec.files import write_bytes

STATUSES = ("passed", "failed", "error", "skipped")


@dataclass
class Case:
    name: str
    classname: str
    status: str  # one of STATUSES
    message: str = ""
    seconds: float | None = None
    output: str = ""


def _row_status(row: dict[str, Any]) -> str:
    status = row.get("status")
    if status in ("passed", "reference"):
        return "passed"
    if status in ("refused", "inconclusive") or (status == "error" and (row.get("error") or {}).get("preflight")):
        return "skipped"
    return "error" if status == "error" else "failed"


def row_cases(rows: Iterable[dict[str, Any]], classname: str) -> list[Case]:
    """A case per row of a run (report.json's rows) or a matrix (matrix.json's rows)."""
    cases = []
    for row in rows:
        status = _row_status(row)
        reasons = "; ".join(row.get("reasons") or [])
        if not reasons and status == "error":
            error = row.get("error") or {}
            reasons = str(error.get("message") or error.get("error") or "the row raised (see the report)")
        metrics = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in (row.get("metrics") or {}).items() if v is not None)
        output = f"{row.get('status')}; " + (metrics or "no metrics") + \
            "".join(f"; {m}" for m in row.get("media") or [])
        cases.append(Case(row["name"], classname, status, reasons or "no reason recorded" if status != "passed"
                          else "", row.get("latency_s"), output))
    return cases


CHECK_STATUS = {"pass": "passed", "fail": "failed", "error": "error", "manual": "skipped", "inconclusive": "skipped"}


def checklist_cases(filled: Iterable[dict[str, Any]]) -> list[Case]:
    """A case per item of the filled-in checklists (`ditgate checklist`)."""
    return [Case(item["id"], f"ditgate.checklist.{checklist['name']}", CHECK_STATUS[item["result"]["status"]],
                 item["result"]["evidence"] if item["result"]["status"] != "pass" else "",
                 None, item["result"]["evidence"])
            for checklist in filled for item in checklist["items"]]


def document(suite: str, cases: list[Case], seconds: float | None = None) -> ET.Element:
    counts = {s: sum(c.status == s for c in cases) for s in STATUSES}
    total = seconds if seconds is not None else sum(c.seconds or 0.0 for c in cases)
    attrs = {"name": suite, "tests": str(len(cases)), "failures": str(counts["failed"]),
             "errors": str(counts["error"]), "skipped": str(counts["skipped"]), "time": f"{total:.3f}"}
    root = ET.Element("testsuites", {k: v for k, v in attrs.items() if k != "skipped"})
    node = ET.SubElement(root, "testsuite", attrs | {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()), "hostname": socket.gethostname()})
    for case in cases:
        element = ET.SubElement(node, "testcase", {"name": case.name, "classname": case.classname,
                                                   "time": f"{case.seconds or 0.0:.3f}"})
        if case.status == "failed":
            ET.SubElement(element, "failure", {"message": case.message, "type": "GateFailed"}).text = case.message
        elif case.status == "error":
            ET.SubElement(element, "error", {"message": case.message, "type": "RowError"}).text = case.message
        elif case.status == "skipped":
            ET.SubElement(element, "skipped", {"message": case.message})
        if case.output:
            ET.SubElement(element, "system-out").text = case.output
    return root


def write(path: str | Path, suite: str, cases: list[Case], seconds: float | None = None) -> Path:
    """Write the JUnit file for `cases` (whole or not at all); returns its path."""
    root = document(suite, cases, seconds)
    ET.indent(root)
    path = Path(path)
    write_bytes(path, ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n")
    return path


def check_writable(path: str | Path | None) -> None:
    """Refuse, before anything runs, a --junit FILE that cannot be written at the end: a folder, a file whose folder
    does not exist (it is not created: a refused command leaves nothing behind), or a folder this process cannot
    write in (tried: a temporary file made and removed)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise DitgateError(f"--junit {path}: is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise DitgateError(f"--junit {path}: {folder} " + ("is not a folder" if folder.exists() else
                                                          "does not exist; create it first"))
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise DitgateError(f"--junit {path}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
