"""TinyChain: FLUX.1's transformer with a chained modulation pair (two Linears in a row) in its double blocks.

Importable as `tinychain` when `examples/` is on `sys.path`; `ditgate` puts it there itself when it loads a model
folder that names it. Its pipeline is diffusers' own `FluxPipeline`.
"""

from .transformer_tinychain import TinyChainTransformer2DModel

__all__ = ["TinyChainTransformer2DModel"]
