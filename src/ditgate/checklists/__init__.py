"""Checklists: the executable checklists of `checklists/NAME.yaml` (validated against their schema, run, written
back filled in) and the registry of named checks.

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.gates`, `ditgate.inspect`, `ditgate.run`, and
`ditgate.skill.markdown` (to resolve the anchors items cite). Never imports `ditgate.notebooks` or `ditgate.commands`.
"""

from ditgate.checklists.facts import check_fact, expect_holds, fact_values
from ditgate.checklists.files import ChecklistError, available, load, validate, validate_all
from ditgate.checklists.runner import RunOptions, run_checklists, write_filled

__all__ = ["ChecklistError", "RunOptions", "available", "check_fact", "expect_holds", "fact_values", "load",
           "run_checklists", "validate", "validate_all", "write_filled"]
