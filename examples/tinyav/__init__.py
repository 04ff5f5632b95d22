"""TinyAV: a tiny text-to-video-and-audio DiT with fused video/audio blocks, outside diffusers.

Importable as `tinyav` when `examples/` is on `sys.path`; `ditgate` puts it there itself when it loads `zoo:tinyav`.
"""

from .pipeline_tinyav import TinyAVPipeline, TinyAVPipelineOutput, TinyAVVocoder
from .transformer_tinyav import TinyAVBlock, TinyAVTransformer3DModel

__all__ = ["TinyAVBlock", "TinyAVPipeline", "TinyAVPipelineOutput", "TinyAVTransformer3DModel", "TinyAVVocoder"]
