"""Run: the phase runner. Rows, one row's execution (load, apply cache-dit, generate, store), the worker group per
world size and its torchrun launch, the preflight, the probes and the proofs that each feature acted, the run folder,
isolation of class-level patches between rows, the CPU compat patches, the speedup prediction and the run report.

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.metrics`, `ditgate.gates`, `ditgate.inspect`.
Never imports `ditgate.perf`, `ditgate.checklists`, `ditgate.notebooks`, `ditgate.commands` or the CLI.
"""
