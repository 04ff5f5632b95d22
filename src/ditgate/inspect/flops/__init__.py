"""FLOPs and bytes of one transformer forward, counted on the meta device: `profile` (the Profile a command and the
runner's prediction read), `count` (GEMM and attention calls per block segment), `models` (the geometry of the
families the counter knows).

May import: `ditgate.core`. Nothing else of `ditgate.inspect`.
"""
