"""`ditgate scaffold` on transformers whose forward refines the image and the text apart (noise and context refiner
block lists) and concatenates them into the one sequence the main blocks take (Lumina2, Z-Image)."""

import pytest
from test_scaffold import report_rows


# the twin's call: a negative prompt padded to another length than the prompt, so the refiners get a text mask
CALL = ("--call", "negative_prompt=blurry", "--call", "max_sequence_length=64")


def _cp_row(run_cli, name, plugin, out):
    code, _, _ = run_cli("run", f"zoo:{name}", *CALL, "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype",
                         "float32", "--out", out, "-q")
    row = report_rows(out)["cp-ulysses-2"]
    return code, row


@pytest.mark.full
@pytest.mark.parametrize("name", ["pipe/lumina2", "pipe/zimage"])
def test_refiners_run_whole_and_the_joint_sequence_splits_at_the_main_blocks(run_cli, tmp_path, name):
    """The sequence is read from the main blocks, not from the first refiner called: the plugin splits the joint
    sequence where the main blocks take it, keeps the refiners whole on every rank (CP_SPLIT_DIMS None; Z-Image's
    refiner attention run without the CP config its processor passes on) and passes cp-ulysses-2. On the survey
    both crashed: Lumina2's 32 text tokens were taken for the image and split at the root, Z-Image gathered nothing
    and its refiners ran Ulysses over whole sequences. The plugin with that earlier choice fails."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", f"zoo:{name}", *CALL, "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert 'CP_SPLIT_DIMS = {"noise_refiner": None, "context_refiner": None, "layers": 1}' in text, text
    assert text.count("its list refines one part of the sequence before the split") == 2, text
    if name == "pipe/lumina2":  # the opposite: the text split at the root, as if it were the image
        split = '"layers.0": {"hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)}'
        assert split in text and '"norm_out": _ContextParallelOutput' in text
        opposite = text.replace(split, split.replace('"layers.0": {"hidden_states"', '"": {"encoder_hidden_states"'))
    else:  # the opposite: the refiners' attention left with the CP config cache-dit sets on it
        local = [line for line in text.splitlines(keepends=True) if line.rstrip().endswith("local=True)")]
        assert len(local) == 2 and '"layers.1": _ContextParallelOutput(gather_dim=1' in text, text
        opposite = "".join(line for line in text.splitlines(keepends=True) if line not in local)
    assert opposite != text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(opposite)
    code, row = _cp_row(run_cli, name, plugin, tmp_path / "opposite")
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]
