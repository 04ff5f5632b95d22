"""Perf: the acceptance matrix of a model cache-dit supports. Its tiers of rows (cache presets, compile,
quantization, CP, TP, hybrid), the matrix table, its JSON and the speedup-against-PSNR plot.

May import: `ditgate.core`, `ditgate.gates`, `ditgate.inspect`, `ditgate.run` (rows, the run folder, the report's
formatting, the speedup prediction). Never imports `ditgate.checklists`, `ditgate.notebooks` or `ditgate.commands`.
"""
