"""`ditgate scaffold` on OmniGen: TP divides the width its attention processor reshapes the heads' output to."""

import builtins
import importlib.util
import os
from pathlib import Path

import pytest
from test_scaffold import report_rows
from two_ranks import run_on_two_ranks

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


class _GroupedAttention:
    """A minimal attention (named like one, so inspect takes it for one): `heads` query heads of 8 over a width of
    32, `kv_heads` key/value heads shared by groups of them, and (`gate`) a Linear whose sigmoid scales the heads'
    joint output before `to_out.0` (Krea 2's `to_gate` when 32 wide; a gate broadcast over the features when 1)."""

    @staticmethod
    def build(kv_heads: int, gate: int | None):
        import torch
        from diffusers.models.attention import FeedForward

        class GroupedAttention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.heads, self.kv_heads = 4, kv_heads
                self.to_q, self.to_k, self.to_v = (torch.nn.Linear(32, n * 8) for n in (4, kv_heads, kv_heads))
                self.to_gate = torch.nn.Linear(32, gate) if gate else None
                self.to_out = torch.nn.ModuleList([torch.nn.Linear(32, 32)])

            def forward(self, x):
                b, n, _ = x.shape
                q = self.to_q(x).view(b, n, self.heads, 8).transpose(1, 2)
                k, v = (p(x).view(b, n, self.kv_heads, 8).transpose(1, 2).repeat_interleave(
                    self.heads // self.kv_heads, dim=1) for p in (self.to_k, self.to_v))
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)
                if self.to_gate is not None:
                    out = out * torch.sigmoid(self.to_gate(x))
                return self.to_out[0](out)

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.attn, self.ff = GroupedAttention(), FeedForward(32, activation_fn="gelu")

            def forward(self, x):
                x = x + self.attn(x)
                return x + self.ff(x)

        torch.manual_seed(0)
        return Block()


def _tp_on_two_ranks(rank, port, kv_heads, gate, plan, divide, result):
    import torch
    import torch.distributed as dist
    from cache_dit.distributed.utils import shard_div_attr
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        block = _GroupedAttention.build(kv_heads, gate)
        x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            whole = block(x)
            try:
                for name in divide:
                    shard_div_attr(block.attn, name, 2)
                styles = {"ColwiseParallel()": ColwiseParallel, "RowwiseParallel()": RowwiseParallel}
                parallelize_module(block, init_device_mesh("cpu", (2,)), {k: styles[v]() for k, v in plan.items()})
                result[rank] = float((block(x) - whole).abs().max())
            except Exception as exc:  # the plan itself fails on this rank: the row would error
                result[rank] = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()


def _run_plan(kv_heads, gate, plan, divide) -> dict:
    return run_on_two_ranks(_tp_on_two_ranks, (kv_heads, gate, plan, divide), 120)[0]


@pytest.mark.full
@pytest.mark.parametrize("kv_heads, gate, error", [(1, None, "kv_heads must be divisible"),
                                                   (4, 1, "size of tensor b (0)")], ids=["one-kv-head", "gate-1-wide"])
def test_the_plan_kept_whole_runs_on_two_ranks_and_the_old_one_does_not(kv_heads, gate, error):
    """On two gloo ranks, the block sharded by the scaffold's plan (the attention kept whole for one key/value head;
    the gate 1 wide kept whole) gives the whole block's output; the plan the old rules wrote (the attention sharded
    with its head counts divided: cache-dit refuses 1 // 2; the gate Colwise: one rank gets no column) errors."""
    from ditgate.inspect.attention import tp_layers
    from ditgate.scaffold.tp import _tp_layers

    block = _GroupedAttention.build(kv_heads, gate)
    chains = [("attn.to_gate", "attn.to_out.0")] if gate else []
    plan, _ = _tp_layers(tp_layers(block, 32), 4, set(), chains, tp=2)
    sharded = any(k.startswith("attn.to_q") for k in plan)
    divide = ["heads", "kv_heads"] if sharded else []
    result = _run_plan(kv_heads, gate, plan, divide)
    assert all(isinstance(result.get(r), float) and result[r] < 1e-5 for r in range(2)), (plan, result)
    attention = {"attn.to_q": "ColwiseParallel()", "attn.to_k": "ColwiseParallel()",
                 "attn.to_v": "ColwiseParallel()", "attn.to_out.0": "RowwiseParallel()"}
    old = plan | attention | ({"attn.to_gate": "ColwiseParallel()"} if gate else {})
    assert old != plan
    result = _run_plan(kv_heads, gate, old, ["heads", "kv_heads"])
    assert any(error in str(result.get(r)) for r in range(2)), (old, result)
