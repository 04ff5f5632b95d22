"""Reuse across runs: the result store (`store`), keyed by content (`keys`).

A run reuses a stored reference row (baseline, baseline-tiled, calibration, sensitivity, and their prompt/seed
copies) when everything its output depends on is the same as when it was stored: the model folder, the request,
the dtype, the device, the library versions and ditgate's own code, the gate table and the row's own definition.
A row that any of these changed for is computed again; `ditgate run --fresh` computes every row. A check that reads
only stored outputs (the gate against the sensitivity rows) is kept too, keyed by the content of what it reads.

It imports core, zoo, gates (the gate table's path), run.define (rows) and run.exec (the run folder's files); the
runner imports it.
"""

from ditgate.run.reuse.keys import key_in_run, reusable, row_key
from ditgate.run.reuse.store import Store, judged

__all__ = ["Store", "judged", "key_in_run", "reusable", "row_key"]
