"""`ditgate scaffold` on Hunyuan-DiT: U-shaped blocks whose loop hands a later block an earlier block's output (a
skip stack inside the loop), which cache-dit's cached block list does not hand on."""

import json

import pytest
from test_scaffold import report_rows

from ditgate.inspect.model import BlockList, Param
from ditgate.scaffold.loop import _functor


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
    assert functor == "BlockLoop({}, skips={'blocks': {'skip': {3: (0, 0)}}})"
    assert "`skip`: block 3 <- block 0" in notes[0] and not any("NOT HANDLED" in n for n in notes)
    changed = _blocks(stream_changed_between=True, loop_findings=["hidden_states changes between block 0 and 1"])
    functor, notes = _functor([changed])  # work on the stream between blocks: still the model's own functor
    assert functor is None and notes[0].startswith("NOT HANDLED: `blocks`: hidden_states changes")
    order = _blocks(loop_findings=["blocks were called in the order [0, 2, 1, 3], not 0..3 once each"])
    functor, notes = _functor([order])  # the skip is handed on; the reordered loop is named
    assert "skips=" in functor and any(n.startswith("NOT HANDLED: `blocks` needs a PatchFunctor") for n in notes)


@pytest.mark.full
def test_hunyuandit_skip_stack_is_handed_on_by_the_functor(run_cli, tmp_path):
    """zoo:pipe/hunyuandit (4 blocks; the loop pushes block 0's output and hands it to block 3 as `skip`): the
    scaffold's BlockLoop keeps block 0's output per call and hands it to block 3 under cache-dit's cached block list:
    the cache row's adapter is proven (caching off equals the baseline, max-abs 0) and cp-ulysses-2 and tp-2 pass
    with the plugin as written. The adapter without the functor (the scaffold's plugin before) errors on the cache
    row: block 3 gets no skip (torch.cat of the stream and None)."""
    out = tmp_path / "hunyuandit.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/hunyuandit", "--out", out, "--rows", "cache,cp-ulysses-2,tp-2",
                                "--run-dir", tmp_path / "run")
    text = out.read_text()
    assert "patch_functor=BlockLoop({}, skips={'blocks': {'skip': {3: (0, 0)}}})" in text, text
    assert "(observed, the same tensor: `skip`: block 3 <- block 0)" in text and "NOT HANDLED" not in text
    rows = report_rows(tmp_path / "run")
    assert rows["cache"]["status"] in ("passed", "inconclusive"), rows["cache"]["reasons"]
    assert rows["cache"]["verdict"]["cache_off"]["max_abs"] == 0.0
    assert rows["cp-ulysses-2"]["status"] == "passed" and rows["tp-2"]["status"] == "passed", stdout + err
    bare = tmp_path / "hunyuandit_no_functor.py"
    bare.write_text(text.replace(text[text.index(",\n                                  patch_functor="):
                                      text.index("\n\n\ndef cp_plan")], ")"))
    code, stdout, _ = run_cli("run", "zoo:pipe/hunyuandit", "--rows", "cache", "--twin", "off", "--integration", bare,
                              "--out", tmp_path / "bare", "--json")
    (row,) = [r for r in json.loads(stdout)["rows"] if r["name"] == "cache"]
    assert code == 1 and row["status"] == "error" and "got NoneType" in row["reasons"][0], row["reasons"]


def test_the_functor_hands_the_skip_on_and_refuses_what_it_cannot_hand():
    """BlockLoop's source as the plugin carries it, on a four-block U (block 3 takes block 0's output as `skip`):
    blocks called one by one with the stream alone (as cache-dit's cached list calls them) give the transformer's
    own output; a call that skips block 0 raises naming both blocks; skips observed on a deeper list raise."""
    import functools
    import inspect

    import cache_dit
    import torch

    from ditgate.scaffold.loop import FUNCTOR

    space = {"functools": functools, "inspect": inspect, "cache_dit": cache_dit, "torch": torch}
    exec(FUNCTOR, space)  # noqa: S102 - the plugin's own code

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, hidden_states, skip=None):
            return self.linear(hidden_states if skip is None else hidden_states + skip)

    class U(torch.nn.Module):
        def __init__(self, run=(0, 1, 2, 3)):
            super().__init__()
            torch.manual_seed(0)
            self.blocks, self.run = torch.nn.ModuleList(Block() for _ in range(4)), run

        def forward(self, x, own_loop=True):
            first = None
            for i in self.run:
                x = self.blocks[i](x, skip=first if own_loop and i == 3 else None)
                first = x if i == 0 else first
            return x

    x = torch.randn(2, 4)
    model = U()
    with torch.no_grad():
        expected = model(x)
        space["BlockLoop"]({}, skips={"blocks": {"skip": {3: (0, 0)}}})._apply(model)
        assert torch.equal(model(x, own_loop=False), expected) and torch.equal(model(x), expected)
        model.run = (1, 2, 3)
        with pytest.raises(RuntimeError, match="block 3 takes block 0's output as `skip`, and block 0 did not run"):
            model(x, own_loop=False)
    with pytest.raises(ValueError, match="observed on a list of more blocks"):
        space["BlockLoop"]({}, skips={"blocks": {"skip": {5: (2, 0)}}})._apply(U())
