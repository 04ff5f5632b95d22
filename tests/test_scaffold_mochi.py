"""`ditgate scaffold` on Mochi: attention over the image and the valid text that the processor joins per sample, the
text whole on every rank."""

import pytest
from test_scaffold import report_rows


@pytest.mark.full
def test_per_sample_text_keys_stay_local_and_the_image_keys_are_gathered(run_cli, tmp_path):
    """Mochi's processor joins each sample's valid text tokens to the image inside the attention call (the group is
    seen as self-attention over 9 keys: 8 image tokens and the valid text). The text stays whole on every rank, so
    the plugin gathers every rank's image keys and keeps its own text keys (gather_keys=True, no Ulysses), and
    declares the text stream whole (CP_SPLIT_DIMS (1, None)): cp-ulysses-2 passes (on the survey it was off by
    max-abs 0.61). Routed through Ulysses as before, the text keys are gathered once per rank and the row fails."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/mochi", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    routed = "route_attention([block.attn1 for block in transformer.transformer_blocks], gather_keys=True)"
    assert routed in text and 'CP_SPLIT_DIMS = {"transformer_blocks": (1, None)}' in text, text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(text.replace("gather_keys=True)", "True, text_first=False)"))  # Ulysses, as before
    code, _, _ = run_cli("run", "zoo:pipe/mochi", "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["cp-ulysses-2"]
    assert code == 1 and row["status"] == "failed" and "max-abs" in " ".join(row["reasons"]), row
