"""Diff: the first module where a row departs from its baseline on the first transformer call. `compare` runs both
sides (the candidate in its worker group), `divergence` records and compares module outputs, `blame` names the module
whose own forward introduced the divergence (or the split of a replicated input), `report` writes diff.md, diff.json
and diff.png.

May import: `ditgate.core`, `ditgate.gates`, `ditgate.run.define`, `ditgate.run.exec`, `ditgate.run.judge`.
"""
