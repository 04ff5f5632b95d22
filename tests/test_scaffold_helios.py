"""`ditgate scaffold` on blocks that take an integer counting the tokens at one end of their sequence (Helios'
`original_context_length`: the video tokens after the history the forward prepends; each block splits its stream
into [history, video] by it)."""

import pytest
from test_scaffold import report_rows

# 64x64 (the twin's size): 144 video tokens after 40 of history, 184 in all, which 2 ranks divide
CALL = ("--call", "height=64", "--call", "width=64")


def _cp_row(run_cli, plugin, out):
    code, _, _ = run_cli("run", "zoo:pipe/helios", *CALL, "--rows", "cp-ulysses-2", "--integration", plugin,
                         "--dtype", "float32", "--out", out, "-q")
    return code, report_rows(out)["cp-ulysses-2"]


@pytest.mark.full
def test_an_integer_counting_the_tail_of_the_sequence_is_counted_per_rank(run_cli, tmp_path):
    """The tail the integer counts is observed (its tokens are `patch_embedding`'s output, at the end of the first
    block's stream); under CP each rank gets the count of those tokens in its own share: cp-ulysses-2 passes. On the
    survey every rank got the whole count (144 of its 92 tokens) and the blocks' split raised; without count_parts
    it raises again, and counting the head instead fails the row (latent max-abs 1.2)."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/helios", *CALL, "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    line = "    count_parts(transformer, transformer.blocks, 'original_context_length', 'tail')\n"
    assert line in text, text
    opposites = {"whole": text.replace(line, ""), "head": text.replace(line, line.replace("'tail'", "'head'"))}
    rows = {}
    for name, opposite in opposites.items():
        plugin = tmp_path / f"{name}.py"
        plugin.write_text(opposite)
        code, rows[name] = _cp_row(run_cli, plugin, tmp_path / name)
        assert code == 1 and rows[name]["status"] in ("failed", "error"), (name, rows[name])
    assert "split_with_sizes" in " ".join(rows["whole"]["reasons"]), rows["whole"]
    assert rows["head"]["status"] == "failed" and "max-abs" in " ".join(rows["head"]["reasons"]), rows["head"]


def test_an_integer_counting_a_part_is_not_counted_per_rank_under_a_root_split():
    """count_parts gives each rank the count of the counted tokens in its contiguous slice of the whole stream. That
    holds for Helios' split at `blocks.0`; under a split at the transformer's inputs each rank's stream is its share of
    every part the forward joins ([its history, its video]), which no slice describes: the scaffold names the integer
    NOT HANDLED there and writes no count_parts (observed on Helios' own anatomy, both split points)."""
    from ditgate.core.model import Model
    from ditgate.inspect.anatomy import inspect_model
    from ditgate.scaffold.cp import count_code

    a = inspect_model(Model.open("zoo:pipe/helios", dtype="float32", device="cpu", height=64, width=64))
    assert [p["argument"] for p in a.traits.part_counts] == ["original_context_length"], a.traits.part_counts
    notes = []
    assert count_code(a, "transformer", False, notes) == [
        "    count_parts(transformer, transformer.blocks, 'original_context_length', 'tail')"]
    assert not any("NOT HANDLED" in n for n in notes), notes
    notes = []
    assert count_code(a, "transformer", True, notes) == []
    assert any(n.startswith("NOT HANDLED: `original_context_length` = 144") and "transformer's inputs" in n
               for n in notes), notes
