"""TinyMM: a tiny joint text-image DiT outside diffusers (the worked example of ditgate's custom-model route).

Importable as `tinymm` when `examples/` is on `sys.path`; `ditgate` puts it there itself when it loads `zoo:tinymm`.
"""

from .pipeline_tinymm import TinyMMPipeline
from .transformer_tinymm import TinyMMAttention, TinyMMAttnProcessor, TinyMMBlock, TinyMMTransformer2DModel

__all__ = ["TinyMMAttention", "TinyMMAttnProcessor", "TinyMMBlock", "TinyMMPipeline", "TinyMMTransformer2DModel"]
