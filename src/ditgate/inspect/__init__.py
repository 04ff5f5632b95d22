"""Inspect: the model's anatomy and a draft integration plan. Observing one real pipeline call (transformer calls,
block inputs and outputs, attention calls), the analysis of blocks, attention and sequence, what the installed
cache-dit already registers for the model's classes, FLOP and byte counts of one forward, the draft plan.

May import: `ditgate.core`, `ditgate.zoo`. Never imports `ditgate.run` or anything above it.
"""
