"""Broken on purpose: Stable Audio's heads sharded as in stable_audio_tp.py, with a q/k norm over the local heads.

A model whose q/k norm runs over all heads (an RMSNorm of width heads x head_dim, as Wan's and many audio DiTs'
`qk_norm="rms_norm_across_heads"`) is wrong under TP when each rank normalizes only the heads it holds:
RMSNorm over the local heads equals the correct one times rms(all heads) / rms(local heads), token by token. Stable
Audio has no q/k norm, so this plan plants exactly that factor: each rank's q and k are multiplied by the ratio of
the root-mean-square over all heads (an all-reduce of the squares) to the one over its own. Every shape is right,
nothing raises, and one rank's arithmetic is unchanged.
"""

import importlib.util
from pathlib import Path

import torch.distributed as dist

_spec = importlib.util.spec_from_file_location("stable_audio_tp", Path(__file__).with_name("stable_audio_tp.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)


def _local_norm(group):
    def hook(module, args, output):
        local = output.float().pow(2).sum(-1, keepdim=True)
        total = local.clone()
        dist.all_reduce(total, group=group)
        width = output.shape[-1]
        ratio = (total / (width * dist.get_world_size(group))).sqrt() / (local / width).sqrt().clamp_min(1e-12)
        return (output.float() * ratio).to(output.dtype)
    return hook


def tp_plan(transformer, tp_mesh, parallelism_config):
    plans = _good.shard_attention(transformer, tp_mesh)
    group = tp_mesh.get_group()
    for block in transformer.transformer_blocks:
        for attn in (block.attn1, block.attn2):
            attn.to_q.register_forward_hook(_local_norm(group))
            attn.to_k.register_forward_hook(_local_norm(group))
    return plans


