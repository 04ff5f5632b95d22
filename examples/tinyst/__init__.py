"""TinyST: a tiny text-to-video DiT with factorized spatio-temporal attention, outside diffusers.

Importable as `tinyst` when `examples/` is on `sys.path`; `ditgate` puts it there itself when it loads `zoo:tinyst`.
"""

from .pipeline_tinyst import TinySTPipeline, TinySTPipelineOutput
from .transformer_tinyst import (TinySTAttention, TinySTAttnProcessor, TinySTSpatialBlock, TinySTTemporalBlock,
                                 TinySTTransformer3DModel)

__all__ = ["TinySTAttention", "TinySTAttnProcessor", "TinySTPipeline", "TinySTPipelineOutput",
           "TinySTSpatialBlock", "TinySTTemporalBlock", "TinySTTransformer3DModel"]
