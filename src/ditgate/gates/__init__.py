"""Gates: the one gate table (`checklists/gates.json`), verdicts with reasons in words, and calibration (the
perturbed rerun that measures a configuration's noise floor).

May import: `ditgate.core` and `ditgate.metrics`. Never imports `ditgate.run`, `ditgate.inspect` or anything above.
`ditgate.gates.evaluate`, `load_gates`, `compare` and the other names below are the package's public interface.
"""

from ditgate.gates.verdicts import (
    DEFAULT_GATES,
    FLOOR_SOURCE,
    METRICS,
    MODALITIES,
    OPS,
    SCHEMA,
    CheckResult,
    Verdict,
    compare,
    evaluate,
    format_value,
    json_ready,
    load_gates,
    validate_gates,
)

__all__ = ["DEFAULT_GATES", "FLOOR_SOURCE", "METRICS", "MODALITIES", "OPS", "SCHEMA", "CheckResult", "Verdict",
           "compare", "evaluate", "format_value", "json_ready", "load_gates", "validate_gates"]
