"""Run: the phase runner, in sub-packages that follow the data.

- `run.define`: what to run: the rows, the cache-dit configurations a row asks for, the preflight that refuses what
  this machine cannot run, the speedup a row should reach.
- `run.exec`: running it: one row's execution (load, apply cache-dit, generate, store), the probes that watch it,
  worker groups and their launch, isolation between rows, the CPU compat patches, reading outputs, the run folder.
- `run.judge`: judging it: gates, proofs that each feature acted, floors in reduced precision, the sensitivity and
  caching-off checks, advice on failure.
- `run.report`: reporting it: report.json, report.md, the grid and the floor's plots.
- `run.diff`: where a failed row first departs from its baseline.
- `run.runner`: the one module that drives all of them in order.

Each sub-package imports only the ones before it in this list (the layering test enforces it).
May import: `ditgate.core`, `ditgate.zoo`, `ditgate.metrics`, `ditgate.gates`, `ditgate.inspect`.
Never imports `ditgate.perf`, `ditgate.checklists`, `ditgate.notebooks`, `ditgate.commands` or the CLI.
"""
