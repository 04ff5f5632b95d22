"""`ditgate scaffold` on FLUX.3 (a modular pipeline): per-token modulation tables the forward expands to the length of
its input, made by modules in dicts of modules and handed to every block, and per-mode image blocks in a dict of
block lists. The shapes of one call rule out a root split; the forward run with its sequence halved shows every
table halved, so the plugin splits at the root."""

import pytest
from test_scaffold import report_rows

ROOT = '"": {"hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3, split_output=False), '


@pytest.mark.full
def test_a_root_split_observed_on_the_halved_call_passes_cp(run_cli, tmp_path):
    """The root split the halved call shows (the text, image and their position ids cut at the transformer's
    inputs; the text's per-mode blocks and the image's, outside the block lists, run Ulysses on their share) passes
    cp-ulysses-2 (on the survey it errored: size 160 vs 320 in the joint RoPE). Split at the first joint block
    instead, as before, the RoPE table over text and image reaches the blocks whole and the row fails."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:flux3", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert ROOT in text and "NOT HANDLED" not in text and "route_attention(" not in text.split("def cp_plan")[1], text
    assert 'CP_SPLIT_DIMS = {"txt_mode_blocks": 1, "single_transformer_blocks": 1}' in text, text
    assert report_rows(tmp_path / "run")["cp-ulysses-2"]["status"] == "passed"
    split = "_ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)"
    first = (f'"single_transformer_blocks.0": {{"hidden_states": {split}, "encoder_hidden_states": {split}}},\n'
             f'        "single_transformer_blocks.*": {{"temb_mod": {split}, "temb_mod_context": {split}}},')
    entry = next(line for line in text.splitlines() if line.strip().startswith(ROOT))
    plugin = tmp_path / "opposite.py"
    plugin.write_text(text.replace(entry, "        " + first))  # the split at the first joint block, as before
    code, _, _ = run_cli("run", "zoo:flux3", "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]
