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
