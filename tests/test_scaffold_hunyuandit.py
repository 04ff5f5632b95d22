"""`ditgate scaffold` on Hunyuan-DiT: U-shaped blocks whose loop hands a later block an earlier block's output (a
skip stack inside the loop), which cache-dit's cached block list does not hand on."""


import pytest
from test_scaffold import cache_row_without_functor, report_rows

from ditgate.inspect.model import BlockList, Param
from ditgate.scaffold.loop import _functor
from ditgate.scaffold.tp import _like


def _blocks(**observed) -> BlockList:
    params = [Param("hidden_states", "positional_or_keyword", False), Param("skip", "positional_or_keyword", True)]
    finding = ("block 3 gets ['skip'] = an earlier block's output (a skip inside the loop), which a cached block "
               "list would not hand on")
    fields = dict(transformer="transformer", attribute="blocks", length=4, block_class="Block", block_module="m",
                  source_file=None, signature=params, returns="", called=True, outputs=["hidden_states"],
                  pattern="Pattern_3", patch_functor_needed=True, loop_findings=[finding],
                  skip_sources={"skip": {3: [0, 0]}})
    return BlockList(**(fields | observed))


def test_a_skip_inside_the_loop_is_handed_on_and_other_loop_work_stays_not_handled():
    functor, notes = _functor([_blocks()])
    assert functor == "BlockLoop({}, skips={'blocks': (['skip'], ['hidden_states'])})"
    assert "`skip`: block 3 <- block 0" in notes[0] and not any("NOT HANDLED" in n for n in notes)
    changed = _blocks(stream_changed_between=True, loop_findings=["hidden_states changes between block 0 and 1"])
    functor, notes = _functor([changed])  # work on the stream between blocks: still the model's own functor
    assert functor is None and notes[0].startswith("NOT HANDLED: `blocks`: hidden_states changes")
    order = _blocks(loop_findings=["blocks were called in the order [0, 2, 1, 3], not 0..3 once each"])
    functor, notes = _functor([order])  # the skip is handed on; the reordered loop is named
    assert "skips=" in functor and any(n.startswith("NOT HANDLED: `blocks` needs a PatchFunctor") for n in notes)


def test_tp_spans_are_picked_by_the_sub_layers_that_set_them_apart_where_those_do():
    """A TP span of blocks that differ from the others by sub-layers (Hunyuan-DiT's `skip_linear` in its last blocks)
    is picked by those sub-layers; groups told apart by parameter shapes alone, or by the same sub-layers as another
    group, keep their indices (None)."""
    rows = [{"blocks": "0-4", "sublayers": ["skip_norm: absent", "skip_linear: absent"]},
            {"blocks": "5-7", "sublayers": ["skip_norm: FP32LayerNorm", "skip_linear: Linear"]}]
    assert _like(rows, "5-7") == {"skip_norm": "FP32LayerNorm", "skip_linear": "Linear"}
    assert _like(rows, "0-4") == {"skip_norm": None, "skip_linear": None} and _like(rows, "0-7") is None
    shapes = [{"blocks": "0", "sublayers": ["same sub-layers, parameter shapes differ"]},
              {"blocks": "1", "sublayers": ["same sub-layers, parameter shapes differ"]}]
    assert _like(shapes, "0") is None
    twice = rows + [{"blocks": "8", "sublayers": ["skip_norm: FP32LayerNorm", "skip_linear: Linear"]}]
    assert _like(twice, "5-7") is None and _like(twice, "0-4") is not None


@pytest.mark.full
def test_hunyuandit_skip_stack_is_handed_on_by_the_functor(run_cli, tmp_path):
    """zoo:pipe/hunyuandit (4 blocks; the loop pushes block 0's output and hands it to block 3 as `skip`): the
    scaffold's BlockLoop finds that pair each call, keeps block 0's output and hands it to block 3 under cache-dit's
    cached block list:
    the cache row's adapter is proven (caching off equals the baseline, max-abs 0) and cp-ulysses-2 and tp-2 pass
    with the plugin as written. The adapter without the functor (the scaffold's plugin before) errors on the cache
    row: block 3 gets no skip (torch.cat of the stream and None)."""
    out = tmp_path / "hunyuandit.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/hunyuandit", "--out", out, "--rows", "cache,cp-ulysses-2,tp-2",
                                "--run-dir", tmp_path / "run")
    text = out.read_text()
    assert "patch_functor=BlockLoop({}, skips={'blocks': (['skip'], ['hidden_states'])})" in text, text
    assert "(observed, the same tensor: `skip`: block 3 <- block 0)" in text and "NOT HANDLED" not in text
    rows = report_rows(tmp_path / "run")
    assert rows["cache"]["status"] in ("passed", "inconclusive"), rows["cache"]["reasons"]
    assert rows["cache"]["verdict"]["cache_off"]["max_abs"] == 0.0
    assert rows["cp-ulysses-2"]["status"] == "passed" and rows["tp-2"]["status"] == "passed", stdout + err
    code, row, _ = cache_row_without_functor(run_cli, tmp_path, "zoo:pipe/hunyuandit", text)
    assert code == 1 and row["status"] == "error" and "got NoneType" in row["reasons"][0], row["reasons"]


def test_the_functor_finds_the_skips_at_each_depth_and_refuses_what_it_cannot_hand():
    """BlockLoop's source as the plugin carries it, on U-shaped stacks of 4 and 8 blocks whose loop pushes the first
    blocks' outputs and pops them into the last ones (HunyuanDiT's loop: pairs 3<-0; 5<-2, 6<-1, 7<-0): one plugin
    line for both. With a stand-in for cache-dit's cached list (one wrapper calling every block with the stream
    alone) each gives the transformer's own output; a call that skips block 0 raises naming both blocks."""
    import contextlib
    import functools
    import inspect

    import cache_dit
    import torch

    from ditgate.scaffold.loop import FUNCTOR

    space = {"contextlib": contextlib, "functools": functools, "inspect": inspect, "cache_dit": cache_dit,
             "torch": torch}
    exec(FUNCTOR, space)  # noqa: S102 - the plugin's own code

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, hidden_states, skip=None):
            return self.linear(hidden_states if skip is None else hidden_states + 2 * skip)

    class Cached(torch.nn.Module):  # holds the list's place during a call, calls the blocks with the stream alone
        def __init__(self, blocks, run):
            super().__init__()
            self.inner, self.run = blocks, run

        def forward(self, hidden_states, skip=None):
            for i in self.run:
                hidden_states = self.inner[i](hidden_states)
            return hidden_states

    class U(torch.nn.Module):
        def __init__(self, depth):
            super().__init__()
            torch.manual_seed(0)
            self.depth, self.blocks = depth, torch.nn.ModuleList(Block() for _ in range(depth))

        def forward(self, x):
            skips = []
            for i, block in enumerate(self.blocks):  # as HunyuanDiT2DModel.forward, from the configured depth
                x = block(x, skip=skips.pop() if i > self.depth // 2 else None)
                if i < self.depth // 2 - 1:
                    skips.append(x)
            return x

    x = torch.randn(2, 4)
    line = {"blocks": (["skip"], ["hidden_states"])}  # what the scaffold writes, whatever the depth observed
    for depth in (4, 8):
        model = U(depth)
        with torch.no_grad():
            expected = model(x)
            space["BlockLoop"]({}, skips=line)._apply(model)
            assert torch.equal(model(x), expected), depth
            own = model.blocks
            model.blocks = torch.nn.ModuleList([Cached(own, range(depth))])
            assert torch.equal(model(x), expected), depth
            model.blocks = torch.nn.ModuleList([Cached(own, range(1, depth))])
            with pytest.raises(RuntimeError, match="block 3 takes block 0's output as `skip`, and block 0 did not"
                               if depth == 4 else "block 7 takes block 0's output as `skip`, and block 0 did not"):
                model(x)


@pytest.mark.full
def test_skips_observed_on_a_deeper_model_follow_its_shorter_twin(run_cli, zoo_path, tmp_path):
    """An 8-layer Hunyuan-DiT (its loop hands block 5 block 2's output, 6 block 1's, 7 block 0's; a 40-layer release
    hands 21 <- 18 ... 39 <- 0) is scaffolded and its rows run on its float32 twin of 4 blocks (there: 3 <- 0). The
    plugin names no pair: BlockLoop finds them on the transformer it runs on, so the twin's cache row is proven
    (caching off, max-abs 0) and cp-ulysses-2 passes; its TP plan picks the blocks with and without `skip_linear` by
    those sub-layers, so tp-2 passes. The same plugin with the pairs and the TP spans fixed as observed on the model
    (the scaffold's plugin before) errors on the twin: the cache row's block 3 gets no skip, tp-2 names block 4."""
    import shutil

    import torch
    from diffusers import HunyuanDiT2DModel

    folder = tmp_path / "hunyuandit-8"
    shutil.copytree(zoo_path("pipe/hunyuandit"), folder)
    config = HunyuanDiT2DModel.load_config(folder / "transformer")
    torch.manual_seed(0)
    HunyuanDiT2DModel.from_config({**config, "num_layers": 8}).save_pretrained(folder / "transformer")
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", folder, "--out", out, "--rows", "cache,cp-ulysses-2,tp-2",
                                "--run-dir", tmp_path / "run")
    text = out.read_text()
    assert "patch_functor=BlockLoop({}, skips={'blocks': (['skip'], ['hidden_states'])})" in text, text
    assert "`skip`: block 5 <- block 2, block 6 <- block 1, block 7 <- block 0)" in text
    rows = report_rows(tmp_path / "run")
    assert rows["cache"]["status"] in ("passed", "inconclusive"), rows["cache"]["reasons"]
    assert rows["cache"]["verdict"]["cache_off"]["max_abs"] == 0.0
    assert rows["cp-ulysses-2"]["status"] == "passed" and rows["tp-2"]["status"] == "passed", stdout + err
    spans = {"blocks_like(transformer.blocks, {'skip_norm': None, 'skip_linear': None})":
             "[transformer.blocks[i] for i in (0, 1, 2, 3, 4)]",
             "blocks_like(transformer.blocks, {'skip_norm': 'FP32LayerNorm', 'skip_linear': 'Linear'})":
             "[transformer.blocks[i] for i in (5, 6, 7)]"}
    fixed = '''

def _observed_pairs(seen, arguments, pairs):  # the pairs observed on the 8-layer model, whatever the depth
    pairs.update({5: {"skip": (2, 0)}, 6: {"skip": (1, 0)}, 7: {"skip": (0, 0)}})


BlockLoop._pairs = staticmethod(_observed_pairs)
'''
    old = tmp_path / "fixed_pairs.py"
    at = text.index("\n\ndef block_adapter")
    text = text[:at] + fixed + text[at:]
    for like, indices in spans.items():
        assert text.count(like) == 1, like
        text = text.replace(like, indices)
    old.write_text(text)
    code, _, _ = run_cli("run", folder, "--rows", "cache,tp-2", "--twin", "only", "--integration", old,
                         "--out", tmp_path / "fixed", "-q")
    rows = report_rows(tmp_path / "fixed")
    assert code == 1 and rows["cache"]["status"] == "error" and "got NoneType" in rows["cache"]["reasons"][0], rows
    assert rows["tp-2"]["status"] == "error" and "index 4 is out of range" in rows["tp-2"]["reasons"][0], rows
