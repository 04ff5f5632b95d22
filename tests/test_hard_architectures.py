"""What real DiTs do, on tiny models built for it: zoo:tinyst (factorized spatio-temporal attention, two interleaved
block lists, a position table built in forward, masked cross-attention under a CFG pair of different lengths) and
zoo:tinymoe (expert-choice MoE, fused SwiGLU, packed experts, chunked modulation, q_norm/k_norm).

inspect's findings are asserted on the observed run; the correct integrations pass the rows they are run on; each
planted fault fails on the check that names it. Runs use few rows (the baseline plus one 2-rank group each).
"""

from pathlib import Path

import pytest

from ditgate import zoo
from ditgate.inspect.anatomy import inspect_model
from ditgate.inspect.text import render
from ditgate.core import request
from ditgate.run.define import rows
from ditgate.core.model import Model
from ditgate.run.runner import RunConfig, run

ROOT = Path(__file__).resolve().parents[1]
TINYST, TINYMOE = ROOT / "examples" / "tinyst", ROOT / "examples" / "tinymoe"
_ANATOMIES: dict = {}


def anatomy(name: str):
    if name not in _ANATOMIES:
        _ANATOMIES[name] = inspect_model(f"zoo:{name}")
    return _ANATOMIES[name]


def _run(model, names, out, integration):
    cfg = RunConfig(model=Model.open(model), rows=rows.select(rows.DEFAULT_ROWS, names), out=out,
                    integration=integration)
    return {r["name"]: r for r in run(cfg, progress=lambda line: None)["rows"]}


def _proofs(result):
    return {p["feature"]: p for p in result["proofs"]}


# -- inspect ----------------------------------------------------------------------------------------------------
def test_tinyst_inspect_interleaved_lists_position_table_and_masks():
    a = anatomy("tinyst")
    t = a.traits
    assert t.interleaved == [["transformer.spatial_blocks", "transformer.temporal_blocks"]]
    assert t.list_layouts == {"transformer.spatial_blocks": "tensor[8, 64, 32] float32",
                              "transformer.temporal_blocks": "tensor[128, 4, 32] float32"}
    (pos,) = [i for i in t.per_block_tensors if i["argument"] == "pos"]
    assert pos["list"] == "transformer.spatial_blocks" and pos["shape"] == [64, 32] and pos["dim"] == 0
    assert pos["made_by"] is None and "split it at `spatial_blocks.*`" in pos["action"]
    # the CFG pair: the short negative prompt pads 25 of 32 text tokens, the prompt 3 (4 frames each)
    (calls,) = t.masks.values()
    assert list(t.masks) == ["transformer.spatial_blocks.*.cross"] and len(calls) == 1
    assert calls[0]["per_sample"] == [0.7812] * 4 + [0.0938] * 4 and t.weak_mask is False
    assert a.has_separate_cfg is False and t.calls_per_step == {"transformer": 1.0}
    assert a.sequence.divisibility["2"]["text_tokens"] is None  # cross-attention: the text is never split
    plan = a.plan
    assert "split before both `spatial_blocks` and `temporal_blocks`" in plan and "CP_SPLIT_DIMS" in plan
    assert "give it one list of pairs" in plan
    assert "`spatial_blocks.*.cross`: cross-attention over a masked text sequence: keep it local" in plan
    assert "split at `spatial_blocks.0`" not in plan


def test_tinymoe_inspect_routing_hazard_gated_mlp_packed_experts_and_modulation():
    a = anatomy("tinymoe")
    t = a.traits
    assert t.sequence_routing == ["transformer.blocks.*.moe: topk over dim 2 of [2, 4, 64] (64 = the sequence)"]
    assert t.gated_mlps == ["transformer.blocks.*.moe.shared.proj_in"]
    assert t.chunked_modulation == ["transformer.blocks.*.ada (chunk 6)"]
    assert [p["parameter"] for p in t.packed_parameters] == ["transformer.blocks.*.moe.w_in",
                                                              "transformer.blocks.*.moe.w_out"]
    assert t.attention_norms == {"transformer.blocks.*.attn.q_norm": "per head",
                                 "transformer.blocks.*.attn.k_norm": "per head"}  # found by what they do
    assert t.repeated_modules == {"transformer.rope": 2}
    assert t.long_skips == ["transformer: the first block's input is added to the stream after `blocks.1`"]
    assert "long skip: the first block's input is added" in a.plan and "so the residual is split too" in a.plan
    (rope,) = t.per_block_tensors
    assert rope["argument"] == "rope" and rope["made_by"] is None and "`blocks.*`" in rope["action"]
    styles = {r["layer"]: r["style"] for r in a.tp_layers["TinyMoEBlock"]}
    assert styles["ada"] == "Colwise(output_layouts=Replicate())"
    assert styles["moe.shared.proj_in"].startswith("fused gated MLP: relayout per rank")
    assert styles["moe.shared.proj_out"].startswith("Rowwise")
    assert "CP hazard: routing over the whole sequence in `blocks.*.moe`" in a.plan
    assert "`\"blocks.*.moe\": {0: _ContextParallelInput(split_dim=1, split_output=True)}`" in a.plan
    assert "packed parameter `blocks.*.moe.w_in` [4, 32, 64]" in a.plan


def test_tinymm_mask_is_observed_on_every_call_with_its_padding_share():
    t = anatomy("tinymm").traits
    (calls,) = t.masks.values()
    assert calls[0]["shape"] == [2, 1, 304, 304] and t.weak_mask is False
    assert calls[0]["per_sample"][0] > calls[0]["per_sample"][1] > 0  # the negative prompt pads more
    assert anatomy("tinymm").attention.mask_all_true is False


@pytest.mark.parametrize("name", zoo.names())
def test_inspect_text_and_plan_never_say_none(name):
    a = anatomy(name)
    for text in (render(a), a.plan):
        assert "None" not in text, [line for line in text.splitlines() if "None" in line]


def test_a_block_module_run_outside_its_block_is_found():
    import torch

    from ditgate.inspect.trace import Trace

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, hidden_states):
            return hidden_states + self.proj(hidden_states)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(2))

        def forward(self, x):
            x = x + self.blocks[0].proj(x)  # the block list read outside the loop
            for block in self.blocks:
                x = block(x)
            return x

    model = Model()
    with torch.no_grad(), Trace({"transformer": model}) as trace:
        model(torch.randn(1, 4, 8))
    assert trace.records["transformer"].outside_calls == ["blocks.0.proj (called while blocks.0 is not running)"]


def test_two_transformers_called_once_each_per_step_are_not_separate_cfg():
    from ditgate.inspect.anatomy import _separate_cfg
    from ditgate.inspect.model import Traits
    from ditgate.inspect.traits import _calls_per_step

    steps = [2, 4, 6]  # pipeline-wide transformer calls counted at each step end
    first, second = _calls_per_step([1, 3, 5], steps), _calls_per_step([2, 4, 6], steps)
    assert first == second == 1.0
    assert _separate_cfg(Traits(calls_per_step={"transformer": first, "transformer_2": second}), 2.0) is False
    assert _separate_cfg(Traits(calls_per_step={"transformer": _calls_per_step([1, 2, 3, 4], [2, 4])}), 2.0)
    assert _calls_per_step([1, 2], [2, 4]) == 2.0  # a high-noise transformer that runs in the first step only


# -- the rows -----------------------------------------------------------------------------------------------------
def test_tinyst_correct_integration_passes_with_each_list_on_its_dimension(tmp_path):
    by_name = _run("zoo:tinyst", "cp-ulysses-2,cache+ulysses-2,tp-2", tmp_path / "run",
                   TINYST / "integration.py")
    failed = {n: r["reasons"] for n, r in by_name.items() if r["status"] not in ("passed", "reference")}
    assert not failed, failed
    cp = _proofs(by_name["cp-ulysses-2"])["cp"]["detail"]
    assert "spatial_blocks: 64 tokens split into 32 per rank (CP_SPLIT_DIMS)" in cp
    assert "temporal_blocks: 128 on dimension 0 split into 64 per rank (CP_SPLIT_DIMS)" in cp
    assert by_name["cp-ulysses-2"]["metrics"]["max_abs"] <= 1e-5
    assert set(_proofs(by_name["cache+ulysses-2"])) == {"cache", "cp"}
    (also,) = by_name["cache+ulysses-2"]["verdict"]["also"]  # the cache gate against the baseline, too
    assert also["against"] == "baseline" and also["phase"] == "cache" and also["passed"], also


def test_tinyst_temporal_list_left_whole_fails_the_cp_proof_naming_it(tmp_path):
    result = _run("zoo:tinyst", "cp-ulysses-2", tmp_path / "run",
                  TINYST / "integration_wrong_split_list.py")["cp-ulysses-2"]
    assert result["status"] == "failed" and result["metrics"]["max_abs"] <= 1e-5  # the output alone is right
    proof = _proofs(result)["cp"]
    assert not proof["passed"] and "temporal_blocks: 128 on dimension 0 per rank (CP_SPLIT_DIMS)" in proof["detail"]


def test_tinymoe_correct_integration_passes_cp_and_tp(tmp_path):
    by_name = _run("zoo:tinymoe", "cp-ulysses-2,tp-2", tmp_path / "run", TINYMOE / "integration.py")
    failed = {n: r["reasons"] for n, r in by_name.items() if r["status"] not in ("passed", "reference")}
    assert not failed, failed


@pytest.mark.parametrize("fault,row", [("integration_sequence_local_routing.py", "cp-ulysses-2"),
                                       ("integration_wrong_swiglu_halves.py", "tp-2")])
def test_tinymoe_faults_fail_the_tensor_rule(fault, row, tmp_path):
    result = _run("zoo:tinymoe", row, tmp_path / "run", TINYMOE / fault)[row]
    assert result["status"] == "failed" and all(p["passed"] for p in result["proofs"])  # the feature acted
    assert any(r.startswith("latent max-abs error") for r in result["reasons"]), result["reasons"]
