"""Broken on purpose: TinyMM's TP plan with the query heads sharded and the key/value heads kept whole
(`replicate_kv`), but each rank pairs its local query heads with key/value heads as if it held the first ones.

Rank 1 computes query heads 2 and 3, which belong to key/value head 1 (4 query heads in groups of 2); this plan hands
them key/value head 0. Every shape is right and nothing raises. The fault is in the attention's processor (which
picks the key/value head of each query head by `attn.kv_index`): `ditgate diff` names the block's `attn`.
"""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "tinymm_integration", Path(__file__).resolve().parents[2] / "examples" / "tinymm" / "integration.py")
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

block_adapter = _good.block_adapter
cp_plan = _good.cp_plan


def _kv_index_ignoring_rank(attn, layout, tp, rank):
    return torch.arange(attn.heads // tp) // (attn.heads // attn.kv_heads)  # rank 0's pairing on every rank


def tp_plan(transformer, tp_mesh, parallelism_config):
    _good.TP_ATTENTION = "replicate_kv"
    _good._kv_index = _kv_index_ignoring_rank
    return _good.tp_plan(transformer, tp_mesh, parallelism_config)
