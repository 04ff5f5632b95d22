"""Judging rows: each row's gate against its baseline (`gating`), the proofs that a feature acted as declared
(`proofs`), the floor of a reduced-precision run (`reduced_floor`), the sensitivity check (`discrimination`), the
caching-off check of a cache row (`cache_off`), and the advice on a failure (`hints`).

May import: `ditgate.core`, `ditgate.metrics`, `ditgate.gates`, `ditgate.run.define`, `ditgate.run.exec` (the run
folder's files).
"""
