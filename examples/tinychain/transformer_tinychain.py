"""diffusers' `FluxTransformer2DModel` whose double blocks compute their AdaLayerNormZero modulation through a
low-rank pair: `norm1.linear` is `Linear(dim, rank)` then `Linear(rank, 6 * dim)`, the first one's output feeding
the second inside the block. Tensor parallelism must not shard both Colwise (the second would receive a shard of
the first's features where it expects all of them): the first is kept whole, or the pair is Colwise then Rowwise."""

from diffusers import FluxTransformer2DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_utils import ModelMixin  # noqa: F401  diffusers finds a component's loader in its module
from torch import nn


class TinyChainTransformer2DModel(FluxTransformer2DModel):
    @register_to_config
    def __init__(self, patch_size: int = 1, in_channels: int = 16, out_channels: int | None = None,
                 num_layers: int = 2, num_single_layers: int = 2, attention_head_dim: int = 16,
                 num_attention_heads: int = 4, joint_attention_dim: int = 32, pooled_projection_dim: int = 32,
                 guidance_embeds: bool = False, axes_dims_rope: tuple[int, int, int] = (4, 4, 8),
                 modulation_rank: int = 16):
        super().__init__(patch_size=patch_size, in_channels=in_channels, out_channels=out_channels,
                         num_layers=num_layers, num_single_layers=num_single_layers,
                         attention_head_dim=attention_head_dim, num_attention_heads=num_attention_heads,
                         joint_attention_dim=joint_attention_dim, pooled_projection_dim=pooled_projection_dim,
                         guidance_embeds=guidance_embeds, axes_dims_rope=axes_dims_rope)
        dim = num_attention_heads * attention_head_dim
        for block in self.transformer_blocks:
            block.norm1.linear = nn.Sequential(nn.Linear(dim, modulation_rank), nn.Linear(modulation_rank, 6 * dim))
