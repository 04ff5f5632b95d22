"""Reporting a run: report.json (validated against `checklists/report.schema.json`), report.md and grid.png
(`run_report`), and the reduced-precision floor's lines and per-frame plot (`floor_report`).

May import: `ditgate.core`, `ditgate.metrics`, `ditgate.gates`, `ditgate.run.define`, `ditgate.run.exec`,
`ditgate.run.judge`.
"""
