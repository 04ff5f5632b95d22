"""TinyMoE: a tiny text-to-image DiT with an expert-choice mixture of experts, outside diffusers.

Importable as `tinymoe` when `examples/` is on `sys.path`; `ditgate` puts it there itself when it loads `zoo:tinymoe`.
"""

from .pipeline_tinymoe import TinyMoEPipeline
from .transformer_tinymoe import (TinyMoEAttention, TinyMoEBlock, TinyMoEExpertChoice, TinyMoESwiGLU,
                                  TinyMoETransformer2DModel)

__all__ = ["TinyMoEAttention", "TinyMoEBlock", "TinyMoEExpertChoice", "TinyMoEPipeline", "TinyMoESwiGLU",
           "TinyMoETransformer2DModel"]
