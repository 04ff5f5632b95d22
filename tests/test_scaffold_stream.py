"""`ditgate scaffold` on block loops that change the stream between block calls (Bria FIBO: each block's text is the
previous block's text cut in half and joined to a per-block text layer; its single blocks take text and image
joined and the loop cuts them apart after each), which cache-dit's cached block list would skip."""

import functools
import inspect

import pytest
from test_scaffold import report_rows


def _space() -> dict:
    import cache_dit
    import contextlib
    import torch

    from ditgate.scaffold.loop import FUNCTOR

    space = {"functools": functools, "inspect": inspect, "cache_dit": cache_dit, "torch": torch,
             "contextlib": contextlib}
    exec(FUNCTOR, space)  # noqa: S102 - the plugin's own code
    return space


def test_the_functor_moves_the_loops_work_into_the_blocks():
    """BlockLoop's source as the plugin carries it, on a model whose loop joins a per-block text to half the
    previous block's text (a counter that runs on into the second list) and cuts a joined stream apart after each
    block of the second list: with cached lists standing for the loops (one wrapper that calls every block with the
    previous block's outputs, the loop run once), the output is the model's own; without `between`, it departs."""
    import torch

    class Pair(torch.nn.Module):  # returns (text, image)
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, hidden_states, encoder_hidden_states, temb):
            joint = torch.cat([encoder_hidden_states, hidden_states], 1).mean(1, keepdim=True)
            return self.a(encoder_hidden_states) + joint, self.b(hidden_states) + joint + temb

    class Single(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, hidden_states, temb):
            return hidden_states + self.a(hidden_states).cumsum(1) + temb

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.pairs = torch.nn.ModuleList(Pair() for _ in range(3))
            self.singles = torch.nn.ModuleList(Single() for _ in range(3))

        def forward(self, x, text, layers, temb):
            used = 0
            for block in self.pairs:
                text = torch.cat([text[..., :2], layers[used]], -1)
                used += 1
                text, x = block(hidden_states=x, encoder_hidden_states=text, temb=temb)
            for block in self.singles:
                text = torch.cat([text[..., :2], layers[used]], -1)
                used += 1
                x = block(hidden_states=torch.cat([text, x], 1), temb=temb)
                text, x = x[:, :text.shape[1]], x[:, text.shape[1]:]
            return x

    class Cached(torch.nn.Module):  # what cache-dit's cached list does with the blocks, caching off
        def __init__(self, blocks, pair):
            super().__init__()
            self.blocks, self.pair = blocks, pair

        def forward(self, hidden_states, encoder_hidden_states=None, *args, **kwargs):
            for block in self.blocks:
                if self.pair:
                    encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, *args, **kwargs)
                else:
                    hidden_states = block(hidden_states, *args, **kwargs)
            return (encoder_hidden_states, hidden_states) if self.pair else hidden_states

    def cached(model):
        model.pairs, model.singles = (torch.nn.ModuleList([Cached(model.pairs, True)]),
                                      torch.nn.ModuleList([Cached(model.singles, False)]))
        return model

    space = _space()
    x, text, temb = torch.randn(2, 5, 4), torch.randn(2, 3, 4), torch.randn(2, 1, 4)
    layers = [torch.randn(2, 3, 2) for _ in range(6)]
    between = {"pairs": ["encoder_hidden_states", "hidden_states"], "singles": ["hidden_states"]}
    with torch.no_grad():
        expected = Model()(x, text, layers, temb)
        model = Model()
        space["BlockLoop"]({}, between=between)._apply(model)
        assert torch.equal(model(x, text, layers, temb), expected)  # the loop's own blocks: unchanged
        assert torch.equal(cached(model)(x, text, layers, temb), expected)
        assert torch.equal(model(x, text, layers, temb), expected)  # every call traces its own values
        bare = cached(Model())(x, text, layers, temb)  # the old plugin: no functor
    assert (bare - expected).abs().max() > 0.1


def test_blocks_that_do_not_chain_are_no_loop_and_a_stream_cut_between_blocks_is_seen():
    """inspect on a model with a ModuleList of per-layer projections (each run on its own input) and a loop that
    cuts its stream between blocks: the projections are no block loop (chained False, no pattern, left out of the
    adapter without NOT HANDLED); the loop's stream is seen to change and goes to `between`."""
    import torch

    from ditgate.inspect.blocks import observe_transformer
    from ditgate.scaffold.loop import _functor

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, hidden_states, temb):
            return hidden_states + self.a(hidden_states) + temb

    class Projection(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, caption):
            return self.a(caption)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.projections = torch.nn.ModuleList(Projection() for _ in range(3))
            self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

        def forward(self, x, layers, temb):
            layers = [p(layer) for p, layer in zip(self.projections, layers)]
            for i, block in enumerate(self.blocks):
                x = block(torch.cat([x[:, :4], layers[i]], 1), temb)
            return x

    torch.manual_seed(0)
    model = Model()
    lists, _, _ = observe_transformer(model, lambda: model(torch.randn(2, 4, 4), [torch.randn(2, 2, 4)] * 3,
                                                           torch.randn(2, 1, 4)))
    found = {b.attribute: b for b in lists}
    assert not found["projections"].chained and found["projections"].pattern is None
    assert found["blocks"].chained and found["blocks"].stream_changed_between
    functor, notes = _functor([found["blocks"]])
    assert functor == "BlockLoop({}, between={'blocks': ['hidden_states']})", notes


@pytest.mark.full
def test_bria_fibo_loop_work_moves_into_the_blocks_and_the_text_layers_are_split(run_cli, tmp_path):
    """zoo:pipe/bria-fibo: the scaffold's plugin passes cache (caching off max-abs 0), cp-ulysses-2 and tp-2 as
    written: BlockLoop(between=...) has each block redo the loop's work on the previous block's outputs, the
    per-layer text projections (`caption_projection`, blocks that do not chain) stay out of the adapter, and the
    per-block text layers (a list input) are split under CP. The old choices fail the named rows: without the
    functor the cache row departs from the baseline (caching off); with the text layers whole, cp-ulysses-2 errors
    joining a rank's text share to a whole text layer."""
    out = tmp_path / "bria.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/bria-fibo", "--out", out, "--rows", "cache,cp-ulysses-2,tp-2",
                                "--run-dir", tmp_path / "run")
    text = out.read_text()
    between = ("patch_functor=BlockLoop({}, between={'transformer_blocks': ['encoder_hidden_states', "
               "'hidden_states'], 'single_transformer_blocks': ['hidden_states']})")
    assert between in text and "split_list_inputs(transformer, {'text_encoder_layers': 1})" in text, text
    assert "pipe.transformer.caption_projection" not in text and "NOT HANDLED" not in text, text
    rows = report_rows(tmp_path / "run")
    assert rows["cache"]["status"] == "passed", rows["cache"]["reasons"]
    assert rows["cache"]["verdict"]["cache_off"]["max_abs"] == 0.0
    assert rows["cp-ulysses-2"]["status"] == "passed" and rows["tp-2"]["status"] == "passed", stdout + err
    bare = tmp_path / "no_functor.py"
    bare.write_text(text.replace(",\n                                  " + between, ""))
    code, _, _ = run_cli("run", "zoo:pipe/bria-fibo", "--rows", "cache", "--integration", bare, "--dtype", "float32",
                         "--out", tmp_path / "bare", "-q")
    row = report_rows(tmp_path / "bare")["cache"]
    assert code == 1 and row["status"] in ("failed", "error"), row
    assert "caching off" in " ".join(row["reasons"]) or row["status"] == "error", row["reasons"]
    whole = tmp_path / "whole_layers.py"
    whole.write_text(text.replace("    split_list_inputs(transformer, {'text_encoder_layers': 1})\n", ""))
    code, _, _ = run_cli("run", "zoo:pipe/bria-fibo", "--rows", "cp-ulysses-2", "--integration", whole, "--dtype",
                         "float32", "--out", tmp_path / "whole", "-q")
    row = report_rows(tmp_path / "whole")["cp-ulysses-2"]
    assert code == 1 and row["status"] == "error" and "Sizes of tensors must match" in row["reasons"][0], row


@pytest.mark.full
def test_hidream_passes_cache_cp_and_tp_and_each_old_choice_fails_its_row(run_cli, tmp_path):
    """zoo:pipe/hidream. Cache: its double block takes `hidden_states_masks` second, where cache-dit's cached list
    passes `encoder_hidden_states`, and its single-block loop joins a per-block text layer to the stream and cuts it
    back after each block (a block counter run on from the double blocks): BlockLoop passes the streams on by name
    (`calls`) and has each block redo the loop's work (`between`); caching off max-abs 0. CP: the text is joined in
    the forward from per-layer projections (`caption_projection.*`, blocks that do not chain), split where they are
    made, and the RoPE table over image then text is cut to each rank's image and text rows (`cut_joint_table`).
    The old choices fail: without `calls` the cache row errors (multiple values for `hidden_states_masks`), without
    `between` it departs with caching off; the table left whole, or the text split at the first block instead of
    where its pieces are made, fails cp-ulysses-2. `caption_projection` (4 text projections that do not chain, once
    named NOT HANDLED with the scaffold refusing the model) stays out of the adapter."""
    out = tmp_path / "hidream.py"
    run_cli("scaffold", "zoo:pipe/hidream", "--out", out, "--rows", "cache,cp-ulysses-2,tp-2", "--run-dir",
            tmp_path / "run")
    text = out.read_text()
    between = ("between={'single_stream_blocks': ['hidden_states'], 'double_stream_blocks': ['hidden_states', "
               "'encoder_hidden_states']}")
    calls = "calls={'double_stream_blocks': ['hidden_states', 'encoder_hidden_states']}"
    pieces = '"caption_projection.*": {0: _ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},'
    cuts = [line for line in text.splitlines() if line.startswith("    cut_joint_table(transformer, ")]
    assert f"patch_functor=BlockLoop({{}}, {between}, {calls}))" in text and pieces in text and len(cuts) == 2, text
    adapter = text.split("def block_adapter")[1].split("def cp_plan")[0]
    assert "caption_projection]" not in adapter, adapter  # blocks that do not chain: no block list of the adapter
    rows = report_rows(tmp_path / "run")
    assert rows["cache"]["status"] == "passed" and rows["cache"]["verdict"]["cache_off"]["max_abs"] == 0.0, rows
    assert rows["cp-ulysses-2"]["status"] == "passed" and rows["tp-2"]["status"] == "passed", rows
    at_block = '"encoder_hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)}'
    opposite = {"no_calls": ("cache", text.replace(f", {calls}", ""), "multiple values"),
                "no_between": ("cache", text.replace(f"{between}, ", ""), "caching off"),
                "whole_table": ("cp-ulysses-2", "\n".join(x for x in text.splitlines() if x not in cuts), "size"),
                "text_at_block": ("cp-ulysses-2", text.replace(pieces, "").replace(
                    "split_output=False)},\n", "split_output=False), " + at_block + ",\n", 1), "size")}
    for name, (row_name, plugin, expect) in opposite.items():
        assert plugin != text, name
        (tmp_path / f"{name}.py").write_text(plugin)
        code, _, _ = run_cli("run", "zoo:pipe/hidream", "--rows", row_name, "--integration", tmp_path / f"{name}.py",
                             "--dtype", "float32", "--out", tmp_path / name, "-q")
        row = report_rows(tmp_path / name)[row_name]
        assert code == 1 and expect in " ".join(row["reasons"]), (name, row["reasons"])


def test_a_vector_as_wide_as_image_and_text_is_no_joint_table():
    """A [batch, features] vector whose width equals the image and text tokens (HunyuanVideo's `temb`, [1, 64]) is
    not cut at the blocks and stays NOT HANDLED; a table with the tokens on dim 1 of more dims is cut."""
    from ditgate.inspect.model import BlockList, Param

    from ditgate.scaffold.joint import joint_tables

    params = [Param("hidden_states", "positional_or_keyword", False), Param("temb", "positional_or_keyword", False),
              Param("rope", "positional_or_keyword", True)]
    b = BlockList(transformer="transformer", attribute="blocks", length=2, block_class="B", block_module="m",
                  source_file=None, signature=params, returns="", called=True, encoder_param="encoder_hidden_states",
                  call={"inputs": {"hidden_states": "tensor[1, 48, 8] float32", "temb": "tensor[1, 64] float32",
                                   "rope": "tensor[1, 64, 4, 2] float32"}})
    notes = []
    assert joint_tables(["embed: output 0 [1, 64] (dim 1: image + text tokens)"], [b], 48, notes) == []
    assert notes[0].startswith("NOT HANDLED: a per-token table over image and text concatenated (embed")
    code = joint_tables(["pe: output 0 [1, 64, 4, 2] (dim 1: image + text tokens)"], [b], 48, notes)
    assert code == ["    cut_joint_table(transformer, transformer.blocks, 'rope', 1, 'hidden_states', "
                    "'encoder_hidden_states')"], code
