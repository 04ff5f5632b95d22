"""`ditgate diff`: each planted fault is located at the module it is in; a correct integration shows no divergence.

Real pipelines, real cache-dit, real torchrun (gloo): the baseline runs in this process, the row on 2 ranks. The
request is 64x64 (fewer tokens than the zoo default) to keep each diff short.
"""

import json
from pathlib import Path

import pytest
from two_ranks import run_on_two_ranks

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "tests" / "plugins"
TINYMM = ROOT / "examples" / "tinymm"


def _diff(zoo_path, tmp_path, model, row_name, integration, dtype="float32"):
    from ditgate.core.model import Model
    from ditgate.run.define import rows
    from ditgate.run.diff.compare import DiffConfig, diff

    path = zoo_path(model)
    chosen = {r.name: r for r in rows.select(rows.DEFAULT_ROWS, row_name)}
    row = chosen[row_name]
    cfg = DiffConfig(model=Model.open(path, height=64, width=64, dtype=dtype), row=row, baseline=chosen[row.baseline],
                     out=tmp_path / "diff", integration=integration, timeout=300)
    return diff(cfg)


def _fault_size() -> float:
    from ditgate.gates.verdicts import load_gates

    return load_gates()["rules"]["sensitivity"]["fault_size"]


def _output_change(out: Path) -> float:
    """The relative RMS change the row makes to the transformer's output on the first call (its sampled elements):
    what gates.json rules.sensitivity.fault_size is calibrated on (the smallest planted fault's)."""
    import math

    base, cand = ((json.loads((out / "summary" / side / "summaries.json").read_text())["summaries"])
                  for side in ("baseline", "candidate"))
    if "samples" not in cand.get("transformer", {}):  # the row raised before the call returned: no size to compare
        return math.inf
    b, c = base["transformer"]["samples"], cand["transformer"]["samples"]
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(b, c)) / sum(x * x for x in b))


FAULTS = [
    # (model, row, integration, the module the fault is in)
    ("flux", "cp-ulysses-2", PLUGINS / "flux_cp_rope_joint_slice.py", "transformer.pos_embed"),
    ("flux", "tp-2", PLUGINS / "flux_tp_heads_not_divided.py", "transformer.transformer_blocks.0.attn"),
    ("flux", "tp-2", PLUGINS / "flux_tp_wrong_shard.py", "transformer.transformer_blocks.0.ff.net.0.proj"),
    ("tinymm", "cp-ulysses-2", TINYMM / "integration_mask_not_reordered.py", None),  # filled below
    # a processor that ignores the CP config: to_out.0 is the first output off; the attention is named, not to_out
    ("flux", "cp-ulysses-2", PLUGINS / "flux_cp_processor_ignores_cp.py", "transformer.transformer_blocks.0.attn"),
    # the text split where it must stay whole: the halves stitched back are identical; the split is named
    ("wan", "cp-ulysses-2", PLUGINS / "wan_cp_text_split.py", "transformer.blocks.0"),
    # GQA: rank 1's query heads paired with rank 0's key/value head (TP, key/value heads kept whole)
    ("tinymm", "tp-2", PLUGINS / "tinymm_tp_gqa_wrong_kv.py", "transformer.transformer_blocks.0.attn"),
]
PROCESSOR_FAULTS = {"integration_mask_not_reordered", "flux_cp_processor_ignores_cp", "tinymm_tp_gqa_wrong_kv"}  # "its processor" in the reason
FAST = {"integration_mask_not_reordered"}  # the fast tier locates one fault; the full tier every fault


@pytest.mark.parametrize("model,row,integration,module", [
    pytest.param(*f, id=f[2].stem, marks=() if f[2].stem in FAST else pytest.mark.full) for f in FAULTS])
def test_planted_fault_is_located(zoo_path, tmp_path, model, row, integration, module):
    report = _diff(zoo_path, tmp_path, model, row, integration)
    if module is None:  # TinyMM: the mask goes wrong inside the first block's attention processor
        assert report["named"].endswith(".attn"), report["reason"]
        assert ".0." in report["named"] or report["named"].endswith("blocks.0.attn"), report["named"]
    else:
        assert report["named"] == module, report["reason"]
    if integration.stem in PROCESSOR_FAULTS:
        assert "its processor" in report["reason"] and ".to_out" not in report["named"], report["reason"]
    if integration.stem == "wan_cp_text_split":
        assert report["reason"].startswith("a replicated input split across the ranks"), report["reason"]
        assert report["split"]["attention"] == "transformer.blocks.0.attn2", report["split"]
    assert _output_change(tmp_path / "diff") >= _fault_size()  # the sensitivity check's size is no larger
    first = next(x for x in report["lines"] if x["module"] == report["first"])
    assert first["diverged"]
    assert all(not x["diverged"] for x in report["lines"][:first["index"]])  # nothing earlier left the tolerance
    out = tmp_path / "diff"
    assert (out / "diff.png").stat().st_size > 1000
    assert report["named"] in (out / "diff.md").read_text()
    assert json.loads((out / "diff.json").read_text())["named"] == report["named"]


@pytest.mark.full
def test_correct_integration_reports_no_divergence(zoo_path, tmp_path):
    report = _diff(zoo_path, tmp_path, "flux", "cp-ulysses-2", PLUGINS / "flux_good.py")
    assert report["named"] is None and report["first"] is None, report["reason"]
    lines = report["lines"]
    assert len(lines) > 100 and all(x["status"] in ("identical", "differs") for x in lines)
    gathered = {x["gathered"] for x in lines}
    assert any(g.startswith("gathered") for g in gathered)  # the joint sequence was reassembled stream by stream
    assert any(g.startswith("concatenated") for g in gathered)
    worst = max(x["rel"] for x in lines)
    assert 0 < worst < report["tolerance"]["rel_max_abs"]  # the ranks really computed differently, within tolerance
    memory = report["memory"]
    assert memory["summaries_bytes"] < memory["full_outputs_bytes"] / 5


@pytest.mark.full
def test_failed_exact_row_gets_a_diff_section(zoo_path, tmp_path):
    """The runner's hook: a CP row without a gather fails its gate and its report names the missing gather."""
    from ditgate.core.model import Model
    from ditgate.run.define import rows
    from ditgate.run.runner import RunConfig, run

    cfg = RunConfig(model=Model.open("zoo:flux", height=64, width=64), rows=rows.select(rows.DEFAULT_ROWS,
                    "cp-ulysses-2"), out=tmp_path / "run", integration=PLUGINS / "flux_cp_no_gather.py", timeout=300, diff=True)
    report = run(cfg, progress=lambda line: None)
    row = next(r for r in report["rows"] if r["name"] == "cp-ulysses-2")
    assert row["status"] in ("failed", "error")  # it may crash in the scheduler: the diff stops before that
    assert row["diff"]["named"] == "transformer.proj_out", row["diff"]
    assert any(r.startswith("diff: first divergence at transformer.proj_out") for r in row["reasons"])
    assert (Path(row["diff"]["folder"]) / "diff.md").is_file()
    baseline = next(r for r in report["rows"] if r["name"] == "baseline")
    assert baseline["diff"] is None


def test_diff_cli_user_errors(run_cli):
    code, _, err = run_cli("diff", "zoo:flux", "--row", "baseline")
    assert code == 2 and "reference row" in err
    code, _, err = run_cli("diff", "zoo:flux", "--row", "no-such-row")
    assert code == 2 and "unknown row" in err


def test_summaries_tell_one_changed_element_apart():
    """The summary pass sees a one-element change: the digest changes, and the sampled error does when sampled."""
    import torch

    from ditgate.run.diff.divergence import SAMPLES, compare_summaries, sample_indices, summarize

    base = torch.randn(4, 300, dtype=torch.bfloat16)
    index = int(sample_indices(base.numel(), "cpu")[0])
    cand = base.clone()
    cand.view(-1)[index] += 1.0
    a, b = summarize(base), summarize(cand)
    assert summarize(base.clone())["hash"] == a["hash"] != b["hash"]
    assert len(a["samples"]) == SAMPLES
    same, changed = compare_summaries({"m": a}, {"m": summarize(base.clone())}, 0.05), compare_summaries(
        {"m": a}, {"m": b}, 0.05)
    assert same[0]["status"] == "identical" and not same[0]["diverged"]
    assert changed[0]["status"] == "differs" and changed[0]["diverged"] and changed[0]["max_abs"] >= 0.9


def test_caller_is_the_module_whose_forward_ran():
    """A module inside a ModuleList (`to_out.0`) is called by the attention, not by the list: the caller the diff
    names when the first diverging output's input already differs. Real diffusers attention, hooked as the diff
    hooks it."""
    import torch
    from diffusers.models.attention_processor import Attention

    from ditgate.run.diff.divergence import Recorder, Stop

    attn = Attention(query_dim=16, heads=2, dim_head=8, cross_attention_dim=12)
    recorder = Recorder().attach_components({"transformer": attn})
    try:
        attn(torch.randn(1, 6, 16), encoder_hidden_states=torch.randn(1, 4, 12))
    except Stop:
        pass
    recorder.detach()
    assert recorder.returned
    assert recorder.callers["transformer.to_out.0"] == "transformer"  # not the ModuleList transformer.to_out
    assert recorder.callers["transformer.to_k"] == "transformer"
    assert recorder.processors["transformer"] == type(attn.processor).__name__
    assert recorder.entered["transformer.to_q"] <= list(recorder.summaries).index("transformer.to_q")


def test_a_transformer_returning_two_streams_is_recorded():
    """An audio-video transformer returns video and audio (diffusers' AudioVisualModelOutput): the call counts as
    returned and both outputs are recorded (it once stopped with "the pipeline call ended without calling a
    transformer")."""
    import torch
    from diffusers.models.transformers.transformer_ltx2 import AudioVisualModelOutput

    from ditgate.run.diff.divergence import Recorder, Stop

    class TwoStreams(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.video, self.audio = torch.nn.Linear(8, 8), torch.nn.Linear(4, 4)

        def forward(self, hidden_states, audio_hidden_states):
            return AudioVisualModelOutput(sample=self.video(hidden_states), audio_sample=self.audio(audio_hidden_states))

    model = TwoStreams()
    recorder = Recorder().attach_components({"transformer": model})
    with pytest.raises(Stop):
        model(torch.randn(1, 5, 8), torch.randn(1, 3, 4))
    recorder.detach()
    assert recorder.returned
    assert {"transformer[sample]", "transformer[audio_sample]"} <= set(recorder.summaries)


def test_per_rank_tensor_is_not_blamed():
    """A tensor the ranks build per rank (a mask over local queries and every key) cannot be made whole: it is
    listed as not compared, never as the first divergence."""
    import torch

    from ditgate.run.diff.divergence import compare_summaries, summarize

    base = {"t.attn:attention_mask": summarize(torch.ones(1, 1, 12, 12)), "t.proj": summarize(torch.ones(3))}
    cand = {"t.attn:attention_mask": {"shape": [1, 1, 8, 10], "missing": "per rank: ...", "per_rank": True},
            "t.proj": summarize(torch.ones(3))}
    lines = compare_summaries(base, cand, 1e-4)
    assert lines[0]["status"] == "not compared" and not lines[0]["diverged"]
    assert not any(x["diverged"] for x in lines)
    cand["t.proj"] = summarize(torch.full((3,), 2.0))
    assert [x["diverged"] for x in compare_summaries(base, cand, 1e-4)] == [False, True]


@pytest.mark.full
def test_audio_video_pipeline_diff_reads_the_per_stream_declaration(zoo_path, tmp_path):
    """zoo:tinyav returns frames and audio; its blocks return (video, audio) with CP_SPLIT_DIMS (1, None): the audio
    kept whole. The correct plan shows no divergence (each block output read by its stream's declaration); a plan
    that splits the audio too is named at the split, as a stream declared whole, not at the audio attention."""
    from ditgate.core.model import Model
    from ditgate.run.define import rows
    from ditgate.run.diff.compare import DiffConfig, diff

    chosen = {r.name: r for r in rows.select(rows.DEFAULT_ROWS, "cp-ulysses-2")}
    examples = ROOT / "examples" / "tinyav"

    def run(plugin, out):
        model = Model.open(zoo_path("tinyav"), call={"audio_frames": 32})
        return diff(DiffConfig(model=model, row=chosen["cp-ulysses-2"], baseline=chosen["baseline"],
                               out=tmp_path / out, integration=examples / plugin, timeout=300))

    good = run("integration.py", "good")
    assert good["named"] is None, good["reason"]
    assert all(not x["diverged"] for x in good["lines"])
    bad = run("integration_audio_split.py", "bad")
    assert bad["named"] == "transformer.blocks.0", bad["reason"]
    assert bad["reason"].startswith("a stream CP_SPLIT_DIMS declares kept whole"), bad["reason"]
    assert bad["split"]["attention"] == "transformer.blocks.0.audio_attn"


def _record_on_two_ranks(rank, port, reference, result):
    import torch
    import torch.distributed as dist

    from ditgate.run.diff.divergence import Recorder

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        recorder = Recorder(reference=reference)
        # a mask built per rank over its local queries and keys (6 of 12 each way): no gather along one dim makes it
        recorder._keep("t.attn:attention_mask", torch.ones(1, 1, 6, 6))
        # a sequence split in halves: gathered along dim 1
        recorder._keep("t.proj", torch.arange(6.0).reshape(1, 6, 1) + 6 * rank)
        if rank == 0:
            result.update(summaries=recorder.summaries, notes=recorder.notes)
    finally:
        dist.destroy_process_group()


def test_per_rank_tensor_on_two_ranks_is_not_compared_and_a_split_one_is_gathered():
    """On two gloo ranks: the recorder gathers a tensor split along one dimension and marks one that no such gather
    makes whole (a per-rank mask) as per rank; the comparison lists the mask as not compared and never as diverged."""
    import torch

    from ditgate.run.diff.divergence import compare_summaries, summarize

    base = {"t.attn:attention_mask": summarize(torch.ones(1, 1, 12, 12)),
            "t.proj": summarize(torch.arange(12.0).reshape(1, 12, 1))}
    result, exits = run_on_two_ranks(_record_on_two_ranks, (base,), 60)
    assert all(code == 0 for code in exits)
    cand, notes = dict(result["summaries"]), dict(result["notes"])
    assert cand["t.attn:attention_mask"]["per_rank"] and notes["t.attn:attention_mask"].startswith("per rank")
    assert notes["t.proj"] == "concatenated along dim 1"
    lines = compare_summaries(base, cand, 1e-4)
    assert [x["status"] for x in lines] == ["not compared", "identical"]
    assert not any(x["diverged"] for x in lines)


@pytest.mark.full
def test_factorized_model_with_a_flattened_batch_dimension_shows_no_divergence(zoo_path, tmp_path):
    """zoo:tinyst's temporal blocks hold [batch x local tokens, frames, dim] on each rank (CFG batched: 2 items):
    concatenated along dim 0 the pieces are in the wrong order; gathered item by item they equal the baseline, so
    the correct integration shows no divergence (it once blamed temporal_blocks.0.norm1)."""
    from ditgate.core.model import Model
    from ditgate.run.define import rows
    from ditgate.run.diff.compare import DiffConfig, diff

    chosen = {r.name: r for r in rows.select(rows.DEFAULT_ROWS, "cp-ulysses-2")}
    report = diff(DiffConfig(model=Model.open(zoo_path("tinyst")), row=chosen["cp-ulysses-2"],
                             baseline=chosen["baseline"], out=tmp_path / "diff",
                             integration=ROOT / "examples" / "tinyst" / "integration.py", timeout=300))
    assert report["named"] is None, report["reason"]
    assert any(x["gathered"].endswith("in 2 groups") for x in report["lines"])
