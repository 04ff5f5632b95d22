"""The proofs that a row's feature acted, on the facts a run records (shapes and counts as the probes store them)."""

from pathlib import Path

import pytest

from ditgate.core.plugin import PluginError, not_covered, split_dims
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


TWO = {"calls_by_transformer": {"transformer": 10, "transformer_2": 22},
       "steps_by_transformer": {"transformer": [0, 1, 2, 3, 4], "transformer_2": list(range(5, 16))}}


def test_cp_proof_covers_a_second_transformer():
    base = {"block_shapes": {"transformer.blocks": [[2, 64, 32]], "transformer_2.blocks": [[2, 64, 32]]}}
    half = {"block_shapes": {"transformer.blocks": [[2, 32, 32]], "transformer_2.blocks": [[2, 64, 32]]}} | TWO
    (proof,) = proofs.check(ULYSSES, half, BASELINE, base)
    assert not proof.passed, proof.detail
    assert ("cp acted on transformer (10 calls, steps 0-4) and not on transformer_2 (22 calls, steps 5-15)"
            in proof.detail), proof.detail
    assert "transformer_2.blocks: 64 tokens per rank, expected 32" in proof.detail
    assert proof.coverage == {"transformer": "acted", "transformer_2": "did not act"}
    declared = half | {"not_covered": {"cp": ["transformer_2"]}}
    (proof,) = proofs.check(ULYSSES, declared, BASELINE, base)
    assert proof.passed and "not covered (declared in NOT_COVERED): transformer_2" in proof.detail, proof.detail
    assert proof.to_dict()["coverage"]["transformer_2"] == "not covered"
    both = {"block_shapes": {"transformer.blocks": [[2, 32, 32]], "transformer_2.blocks": [[2, 32, 32]]}} | TWO
    (proof,) = proofs.check(ULYSSES, both | {"not_covered": {"cp": ["transformer_2"]}}, BASELINE, base)
    assert not proof.passed and "declared in NOT_COVERED for cp, yet cp acted on it" in proof.detail
    (proof,) = proofs.check(ULYSSES, both, BASELINE, base)
    assert proof.passed and "transformer (10 calls, steps 0-4), transformer_2 (22 calls, steps 5-15): each split" \
        in proof.detail, proof.detail


def test_cache_proof_fails_a_second_transformer_left_uncached():
    facts = {"cache": [{"cached_steps": [2, 4], "residual_diffs": {}}], "transformer_calls": 32,
             "last_block_calls": {"transformer.blocks": 5, "transformer_2.blocks": 22}} | TWO
    (proof,) = proofs.check(CACHE, facts, BASELINE, {})
    assert not proof.passed and proof.detail.startswith(
        "cache acted on transformer (10 calls, steps 0-4) and not on transformer_2 (22 calls, steps 5-15)"), \
        proof.detail
    (proof,) = proofs.check(CACHE, facts | {"not_covered": {"cache": ["transformer_2"]}}, BASELINE, {})
    assert proof.passed and proof.detail.endswith("not covered (declared in NOT_COVERED): transformer_2")
    (proof,) = proofs.check(CACHE, facts | {"not_covered": {"cache": ["transformer_3"]}}, BASELINE, {})
    assert not proof.passed and "NOT_COVERED names transformer_3 for cache" in proof.detail
    facts["last_block_calls"]["transformer_2.blocks"] = 15
    (proof,) = proofs.check(CACHE, facts, BASELINE, {})
    assert proof.passed and "transformer.blocks 5 of 10, transformer_2.blocks 7 of 22" in proof.detail, proof.detail


def test_tp_proof_fails_a_second_transformer_left_unsharded():
    facts = {"sharded": {"transformer": {"sharded": 12, "wrong_size": []},
                         "transformer_2": {"sharded": 0, "wrong_size": []}}} | TWO
    (proof,) = proofs.check(TP, facts, BASELINE, {})
    assert not proof.passed and proof.detail.startswith("tp acted on transformer (10 calls"), proof.detail
    (proof,) = proofs.check(TP, facts | {"not_covered": {"tp": ["transformer_2"]}}, BASELINE, {})
    assert proof.passed and "transformer: 12 weights sharded" in proof.detail
    facts["sharded"]["transformer_2"]["sharded"] = 12
    (proof,) = proofs.check(TP, facts, BASELINE, {})
    assert proof.passed and proof.detail.endswith(
        "transformer (10 calls, steps 0-4), transformer_2 (22 calls, steps 5-15): each sharded"), proof.detail


@pytest.mark.parametrize("bad", [[1], {"cp": "transformer_2"}, {"vae": ["transformer_2"]}, {"cache": [""]}])
def test_not_covered_declaration_is_checked(bad, tmp_path):
    with pytest.raises(PluginError, match="NOT_COVERED must map"):
        not_covered(tmp_path / "integration.py", bad)
    assert not_covered(tmp_path, {"cache": ("transformer_2",)}) == {"cache": ["transformer_2"]}


@pytest.mark.parametrize("bad", [[1], {"blocks": "1"}, {"blocks": -1}, {"": 1}, {"blocks": True}])
def test_split_dims_declaration_is_checked(bad, tmp_path):
    with pytest.raises(PluginError, match="CP_SPLIT_DIMS must map"):
        split_dims(tmp_path / "integration.py", bad)
    assert split_dims(tmp_path, {"transformer_2.blocks": None, "blocks": 0}) == {"transformer_2.blocks": None,
                                                                                 "blocks": 0}


# blocks taking two streams, video split and 31 audio tokens kept whole (a fused video/audio block)
AV_BASE = {"block_shapes": {"transformer.blocks": [[2, 64, 32], [2, 31, 32]]}}
AV_KEPT = {"block_shapes": {"transformer.blocks": [[2, 32, 32], [2, 31, 32]]}}


def test_cp_proof_checks_each_stream_against_its_declaration():
    (proof,) = proofs.check(ULYSSES, AV_KEPT | {"cp_split_dims": {"blocks": (1, None)}}, BASELINE, AV_BASE)
    assert proof.passed, proof.detail
    assert "stream 0: 64 on dimension 1 split into 32 per rank; stream 1: [2, 31, 32] whole on every rank, as " \
        "declared" in proof.detail
    (proof,) = proofs.check(ULYSSES, AV_KEPT | {"cp_split_dims": None}, BASELINE, AV_BASE)  # summed: the old proof
    assert not proof.passed and "63 tokens per rank, expected 47.5" in proof.detail
    split_audio = {"block_shapes": {"transformer.blocks": [[2, 32, 32], [2, 16, 32]]}}
    (proof,) = proofs.check(ULYSSES, split_audio | {"cp_split_dims": {"blocks": [1, None]}}, BASELINE, AV_BASE)
    assert not proof.passed and "stream 1: declared whole (None), but [2, 16, 32] per rank" in proof.detail
    (proof,) = proofs.check(ULYSSES, AV_KEPT | {"cp_split_dims": {"blocks": (1,)}}, BASELINE, AV_BASE)
    assert not proof.passed and "declares 1 streams (1), but its blocks returned 2 tensor(s)" in proof.detail


def test_split_dims_per_stream_are_parsed_and_written_back():
    from ditgate.core.plugin import format_split_dims, parse_split_dims

    dims = parse_split_dims("blocks=1:none,refiner=none,temporal_blocks=0")
    assert dims == {"blocks": (1, None), "refiner": None, "temporal_blocks": 0}
    assert parse_split_dims(format_split_dims(dims)) == dims
    with pytest.raises(PluginError, match="per stream"):
        parse_split_dims("blocks=1:x")
    with pytest.raises(PluginError, match="a tuple of them"):
        split_dims(Path("f.py"), {"blocks": ()})
