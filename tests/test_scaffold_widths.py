"""`ditgate scaffold` on OmniGen: TP divides the width its attention processor reshapes the heads' output to."""

import builtins
import importlib.util
import os
from pathlib import Path

import pytest
from test_scaffold import report_rows

STAND_INS = Path(__file__).parent / "stand_ins"


@pytest.fixture
def omnigen_builds(monkeypatch):
    """OmniGenPipeline can be built in this process and in every rank's, with torchvision or without it
    (tests/stand_ins/sitecustomize.py)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STAND_INS), os.environ.get("PYTHONPATH")])))
    before = getattr(builtins, "OmniGenMultiModalProcessor", None)
    spec = importlib.util.spec_from_file_location("omnigen_stand_in", STAND_INS / "sitecustomize.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    yield
    if before is None and hasattr(builtins, "OmniGenMultiModalProcessor"):
        del builtins.OmniGenMultiModalProcessor


@pytest.mark.full
def test_tp_divides_the_width_the_processor_reshapes_with(run_cli, tmp_path, omnigen_builds):
    """OmniGen's processor puts the heads' output back together with `reshape(bsz, q_len, attn.out_dim)`. Under TP
    each rank holds half the heads, so `out_dim` is divided with `heads`: tp-2 passes. Left whole (the plan before),
    two ranks' halves are reshaped to the whole width and the row errors ('shape [2, 478, 64] is invalid')."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/omnigen", "--out", out, "--rows", "tp-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    divided = '"out_dim", tp)'
    assert divided in text and report_rows(tmp_path / "run")["tp-2"]["status"] == "passed", text
    plugin = tmp_path / "opposite.py"
    plugin.write_text("\n".join(line for line in text.splitlines() if divided not in line) + "\n")
    code, _, _ = run_cli("run", "zoo:pipe/omnigen", "--rows", "tp-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["tp-2"]
    assert code == 1 and row["status"] == "error" and "invalid" in " ".join(row["reasons"]), row


def test_tp_divides_what_the_processor_computes_with_not_what_it_tests_against_none():
    """Among the attention's integers that equal a q/k/v width or a head count, those its processor reads are divided
    where it computes with them (OmniGen: `reshape(bsz, q_len, attn.out_dim)`), not where it only tests them against
    None (Flux: `if attn.added_kv_proj_dim is not None`, the text's input width, which TP leaves whole; it equals the
    query width on zoo:flux)."""
    import torch
    from diffusers import FluxTransformer2DModel, OmniGenTransformer2DModel

    from ditgate.scaffold.write import _processors

    torch.manual_seed(0)
    flux = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                  attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                  pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    omnigen = OmniGenTransformer2DModel(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                        intermediate_size=128, num_layers=1, in_channels=4, time_step_dim=16,
                                        vocab_size=300, pad_token_id=0,
                                        rope_scaling={"long_factor": [1.0] * 8, "short_factor": [1.0] * 8})
    groups = {}
    for model in (flux, omnigen):
        _processors(model, groups, [])
    attention = flux.transformer_blocks[0].attn
    assert attention.added_kv_proj_dim == attention.to_q.out_features  # the value alone does not tell them apart
    assert sorted(groups["transformer_blocks.*.attn"]["divide"]) == ["heads", "inner_dim"], groups
    assert "out_dim" in groups["layers.*.self_attn"]["divide"], groups


def _block(kv_heads: int, gate: int | None = None):
    """A block of diffusers' own layers: an attention of 4 heads of 8 over a width of 32 with `kv_heads` key/value
    heads, a feed-forward pair, and (`gate`) a Linear of that width whose output reaches the attention's `to_out.0`."""
    import torch
    from diffusers.models.attention import FeedForward
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    block = torch.nn.Module()
    block.attn = Attention(query_dim=32, heads=4, kv_heads=kv_heads, dim_head=8)
    block.ff = FeedForward(32, activation_fn="gelu")
    if gate:
        block.gate = torch.nn.Linear(32, gate)
    return block


def test_an_attention_whose_key_value_heads_do_not_divide_is_kept_whole():
    """TP divides the key/value heads with the query heads (to_k and to_v Colwise, their head count divided). With one
    key/value head (grouped-query, 4 query heads) at tp 2, to_k/to_v would be cut inside that head and the count
    divided to 0: the attention is kept whole with a note, its feed-forward still sharded. With 2 key/value heads it
    is sharded as before."""
    from ditgate.inspect.attention import tp_layers
    from ditgate.scaffold.tp import _tp_layers

    plan, notes = _tp_layers(tp_layers(_block(kv_heads=1), 32), 4, set(), [], tp=2)
    assert not any(k.startswith("attn.") for k in plan), plan
    assert plan == {"ff.net.0.proj": "ColwiseParallel()", "ff.net.2": "RowwiseParallel()"}, plan
    assert any("`attn`: 1 key/value heads" in n and "kept whole" in n for n in notes), notes
    plan, _ = _tp_layers(tp_layers(_block(kv_heads=2), 32), 4, set(), [], tp=2)
    assert plan["attn.to_k"] == plan["attn.to_v"] == "ColwiseParallel()", plan
    assert plan["attn.to_out.0"] == "RowwiseParallel()", plan


def test_a_linear_reaching_a_rowwise_layer_is_colwise_only_when_its_width_is_split_with_it():
    """A Linear whose output reaches a Rowwise `to_out.0` (observed chain) is sharded Colwise only when its output is
    the features `to_out.0` reads (Krea 2's `to_gate`: 32, the heads times their size) or one per head (4); a gate 1
    wide, broadcast over the features, is kept whole (Colwise would leave one rank no column)."""
    from ditgate.inspect.attention import tp_layers
    from ditgate.scaffold.tp import _tp_layers

    chain = [("gate", "attn.to_out.0")]
    for width, style in ((32, "ColwiseParallel()"), (4, "ColwiseParallel()"), (1, None)):
        plan, notes = _tp_layers(tp_layers(_block(kv_heads=4, gate=width), 32), 4, set(), chain, tp=2)
        assert plan.get("gate") == style and plan["attn.to_out.0"] == "RowwiseParallel()", (width, plan)
    assert any("`gate`'s output reaches `attn.to_out.0` (observed) but is 1 wide" in n and "kept whole" in n
               for n in notes), notes


def test_a_per_head_size_is_told_by_its_name_not_its_value():
    """Stable Audio's attention (8 heads of 8) holds its head count also as `sliceable_head_dim`: divided with
    `heads` although its value equals the head size and its name says dim; a per-head size (`head_dim`) never."""
    import torch
    from diffusers import StableAudioDiTModel

    from ditgate.scaffold.write import _processors

    torch.manual_seed(0)
    model = StableAudioDiTModel(sample_size=16, in_channels=4, num_layers=1, attention_head_dim=8,
                                num_attention_heads=8, num_key_value_attention_heads=8, out_channels=4,
                                cross_attention_dim=16, time_proj_dim=16, global_states_input_dim=16,
                                cross_attention_input_dim=16)
    groups = {}
    _processors(model, groups, [])
    assert sorted(groups["transformer_blocks.*.attn1"]["divide"]) == ["heads", "inner_dim", "inner_kv_dim",
                                                                      "sliceable_head_dim"], groups
    from ditgate.scaffold.write import PER_HEAD_SIZE

    assert all(PER_HEAD_SIZE.fullmatch(n) for n in ("head_dim", "dim_head", "attention_head_dim", "head_size"))
    assert not any(PER_HEAD_SIZE.fullmatch(n) for n in ("sliceable_head_dim", "num_heads", "inner_dim"))
