"""Running rows: one row's execution (load, apply cache-dit, generate, store: `execute`), the probes that record
what each feature did (`probes`), the worker group per world size and its launch (`launch`, `worker`, `lifeline`),
isolation of class-level patches between rows (`isolation`), cache-dit's CPU patches (`compat`), reading what a
pipeline returns (`outputs`, `audio`), modular pipelines' rows (`modular`), and the run folder with its files
(`folder`, `files`).

May import: `ditgate.core`, `ditgate.gates` (calibration noise), `ditgate.run.define`.
"""
