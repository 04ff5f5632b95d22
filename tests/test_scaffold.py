"""`ditgate scaffold`: the plugin written from the observed call, and its rows on the float32 twin."""

import importlib.util
import json

import pytest


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wan_plugin_splits_at_the_first_block_and_keeps_the_text_whole(run_cli, tmp_path):
    out = tmp_path / "wan_plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:wan", "--out", out, "--no-run")
    assert code == 0, err
    text = out.read_text()
    plugin = _load(out)  # it is Python that imports
    assert {"block_adapter", "cp_plan", "tp_plan"} <= set(vars(plugin))
    # Wan's forward makes the sequence itself (5-D latents in): split at blocks.0, RoPE split by its output
    assert '"blocks.0": {"hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3' in text
    assert '"rope": {0: _ContextParallelInput(split_dim=1, expected_dims=4, split_output=True)' in text
    assert "cross attention" in text and "encoder_hidden_states\": _ContextParallel" not in text
    assert "cache_dit.ForwardPattern.Pattern_2" in text and '"proj_out": _ContextParallelOutput' in text
    # Wan normalises q/k over all heads: its attention stays whole under TP, the feed-forward pair is sharded
    assert "`attn1` normalises q/k over all heads" in text and "attn1.to_q" not in text
    assert '"ffn.net.0.proj": ColwiseParallel(), "ffn.net.2": RowwiseParallel()' in text


def test_scaffold_refuses_a_folder_as_out(run_cli, tmp_path):
    code, _, err = run_cli("scaffold", "zoo:wan", "--out", tmp_path, "--no-run")
    assert code == 2 and "is a folder" in err


@pytest.mark.full
def test_flux_plugin_passes_its_rows_and_the_opposite_choice_fails_the_named_row(run_cli, tmp_path):
    out = tmp_path / "flux_plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:flux", "--out", out, "--rows", "cp-ulysses-2,tp-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert '"img_ids": _ContextParallelInput(split_dim=0' in text and "pooled_projections" not in text.split(
        "return {")[1].split("}")[0]
    assert "the other choice, text kept whole, is told apart by cp-ulysses-2" in text
    # the opposite choice: the text kept whole under joint attention
    opposite = tmp_path / "flux_text_whole.py"
    opposite.write_text(text.replace('"encoder_hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3, '
                                     'split_output=False), ', "").replace(
        '"txt_ids": _ContextParallelInput(split_dim=0, expected_dims=2, split_output=False)', ""))
    assert opposite.read_text() != text
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    twin_folder = report["model"]
    code, _, _ = run_cli("run", twin_folder, "--rows", "cp-ulysses-2", "--integration", opposite,
                         "--out", tmp_path / "opposite", "-q")
    assert code == 1
    rows = {r["name"]: r for r in json.loads((tmp_path / "opposite" / "report.json").read_text())["rows"]}
    assert rows["cp-ulysses-2"]["status"] != "passed"
