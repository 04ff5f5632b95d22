"""inspect's findings decided from observed tensors and parameters, on diffusers' own layers (Nucleus-MoE's blocks):
joint attention of image queries on image + text keys, expert layers with their router, shared expert and routing
kind, and blocks of one class with different sub-layers. The whole pipeline (`zoo:pipe/nucleusmoe`) is inspected in
the full tier; the scaffold's rows on it are in tests/test_scaffold.py."""

import pytest
import torch

from ditgate.inspect.attention import _attention_kind
from ditgate.inspect.experts import find_experts
from ditgate.inspect.model import Sequence
from ditgate.inspect.variants import describe, span, variants


def _blocks():
    from diffusers.models.transformers.transformer_nucleusmoe_image import NucleusMoEImageTransformerBlock

    torch.manual_seed(0)
    return torch.nn.ModuleList([NucleusMoEImageTransformerBlock(
        dim=64, num_attention_heads=4, attention_head_dim=16, joint_attention_dim=32, moe_enabled=i > 0,
        num_experts=4, moe_intermediate_dim=32, capacity_factor=1.0) for i in range(3)])


def test_image_queries_on_image_plus_text_keys_are_joint_not_cross():
    seq = Sequence(image_tokens=64, text_tokens=328)
    assert _attention_kind(64, 392, seq) == "joint"  # Nucleus-MoE: the keys hold the queries' own tokens
    assert _attention_kind(392, 392, seq) == "joint"  # MMDiT: both streams query
    assert _attention_kind(64, 328, seq) == "cross"  # keys from the text alone
    assert _attention_kind(64, 64, seq) == "self"


def test_dense_and_moe_blocks_of_one_class_are_told_apart():
    blocks = _blocks()
    assert variants(blocks) == [[0], [1, 2]] and span([0, 1, 2, 5]) == "0-2, 5"
    (rows,) = describe("transformer", {"transformer_blocks": blocks}).values()
    assert [(r["blocks"], r["sublayers"]) for r in rows] == [("0", ["img_mlp: FeedForward"]),
                                                             ("1-2", ["img_mlp: NucleusMoELayer"])]


@pytest.mark.parametrize("sort, routing", [
    ({"module": "transformer_blocks.*.img_mlp", "op": "topk", "dim": 2, "shape": [1, 4, 64], "over_sequence": True},
     "expert-choice"),
    ({"module": "transformer_blocks.*.img_mlp", "op": "topk", "dim": 2, "shape": [1, 64, 4],
      "over_sequence": False}, "token-choice"),
    (None, "not observed")])
def test_packed_experts_router_shared_expert_and_routing_kind(sort, routing):
    (found,) = find_experts("transformer", {"transformer_blocks": _blocks()}, [sort] if sort else [])
    assert found["layer"] == "transformer.transformer_blocks.*.img_mlp" and found["blocks"] == "transformer_blocks 1-2"
    assert found["packed"] == {"img_mlp.experts.gate_up_proj": [4, 64, 64], "img_mlp.experts.down_proj": [4, 32, 64]}
    assert found["router"] == "img_mlp.gate" and found["shared"] == ["img_mlp.shared_expert"]
    assert found["experts"] == 4 and found["routing"] == routing


@pytest.mark.full
def test_nucleusmoe_pipeline_inspected_joint_experts_and_block_structures():
    from ditgate.inspect.anatomy import inspect_model

    a = inspect_model("zoo:pipe/nucleusmoe")
    (g,) = a.attention.groups
    assert (g.kind, g.q_len, g.kv_len, g.mask) == ("joint", 64, 392, True) and a.sequence.joint
    assert a.sequence.divisibility["2"]["text_tokens"] is True  # the text is split too
    (e,) = a.traits.experts
    assert (e["routing"], e["router"], e["shared"]) == ("expert-choice", "img_mlp.gate", ["img_mlp.shared_expert"])
    assert list(a.tp_layers) == ["NucleusMoEImageTransformerBlock[0]", "NucleusMoEImageTransformerBlock[1-2]"]
    assert "joint attention, image queries (64) on image + text keys (392)" in a.plan
    assert "reorder its key columns" in a.plan and "routing expert-choice" in a.plan
