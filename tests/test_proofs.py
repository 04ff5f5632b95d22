"""The proofs that a row's feature acted, on the facts a run records (shapes and counts as the probes store them)."""

import pytest

from ditgate.core.plugin import PluginError, split_dims
from ditgate.run.judge import proofs
from ditgate.run.define.rows import BASELINE, Row

ULYSSES = Row("cp-ulysses-2", "cp", parallel={"ulysses_size": 2})
CACHE = Row("cache", "cache", cache={"Fn_compute_blocks": 1})
TP = Row("tp-2", "tp", parallel={"tp_size": 2})

# factorized attention: spatial blocks see [B*F, N, D], temporal blocks [B*N, F, D]; the tokens N are split
BASE = {"block_shapes": {"transformer.spatial_blocks": [[8, 64, 32]], "transformer.temporal_blocks": [[128, 4, 32]]}}
SPLIT = {"block_shapes": {"transformer.spatial_blocks": [[8, 32, 32]], "transformer.temporal_blocks": [[64, 4, 32]]}}
DECLARED = {"spatial_blocks": 1, "temporal_blocks": 0}


def _cp(facts, dims):
    (proof,) = proofs.check(ULYSSES, facts | {"cp_split_dims": dims}, BASELINE, BASE)
    return proof


def test_cp_proof_checks_each_list_on_its_declared_dimension():
    proof = _cp(SPLIT, DECLARED)
    assert proof.passed, proof.detail
    assert "temporal_blocks: 128 on dimension 0 split into 64 per rank" in proof.detail


def test_cp_proof_without_a_declaration_checks_dimension_1_and_names_the_list():
    proof = _cp(SPLIT, None)
    assert not proof.passed and "temporal_blocks: 4 tokens per rank, expected 2" in proof.detail
    assert "spatial_blocks" not in proof.detail


def test_cp_proof_names_the_list_left_whole():
    whole = {"block_shapes": {"transformer.spatial_blocks": [[8, 32, 32]],
                              "transformer.temporal_blocks": [[128, 4, 32]]}}
    proof = _cp(whole, DECLARED)
    assert not proof.passed and "temporal_blocks: 128 on dimension 0 per rank (CP_SPLIT_DIMS)" in proof.detail
    assert _cp(whole, {"spatial_blocks": 1, "temporal_blocks": None}).passed  # declared whole: checked unchanged


def test_cp_proof_covers_a_second_transformer():
    base = {"block_shapes": {"transformer.blocks": [[2, 64, 32]], "transformer_2.blocks": [[2, 64, 32]]}}
    half = {"block_shapes": {"transformer.blocks": [[2, 32, 32]], "transformer_2.blocks": [[2, 64, 32]]}}
    (proof,) = proofs.check(ULYSSES, half, BASELINE, base)
    assert not proof.passed and "transformer_2.blocks: 64 tokens per rank, expected 32" in proof.detail


def test_cache_proof_fails_a_second_transformer_left_uncached():
    facts = {"cache": [{"cached_steps": [2, 4], "residual_diffs": {}}], "transformer_calls": 16,
             "calls_by_transformer": {"transformer": 8, "transformer_2": 8},
             "last_block_calls": {"transformer.blocks": 5, "transformer_2.blocks": 8}}
    (proof,) = proofs.check(CACHE, facts, BASELINE, {})
    assert not proof.passed and proof.detail.startswith("transformer_2: every block")
    facts["last_block_calls"]["transformer_2.blocks"] = 5
    (proof,) = proofs.check(CACHE, facts, BASELINE, {})
    assert proof.passed and "blocks 3 of 8" in proof.detail


def test_tp_proof_fails_a_second_transformer_left_unsharded():
    facts = {"sharded": {"transformer": {"sharded": 12, "wrong_size": []},
                         "transformer_2": {"sharded": 0, "wrong_size": []}}}
    (proof,) = proofs.check(TP, facts, BASELINE, {})
    assert not proof.passed and proof.detail.startswith("transformer_2: no weight is a sharded DTensor")


@pytest.mark.parametrize("bad", [[1], {"blocks": "1"}, {"blocks": -1}, {"": 1}, {"blocks": True}])
def test_split_dims_declaration_is_checked(bad, tmp_path):
    with pytest.raises(PluginError, match="CP_SPLIT_DIMS must map"):
        split_dims(tmp_path / "integration.py", bad)
    assert split_dims(tmp_path, {"transformer_2.blocks": None, "blocks": 0}) == {"transformer_2.blocks": None,
                                                                                 "blocks": 0}
