"""A pipeline returning frames and audio, on fused video/audio blocks (zoo:tinyav, examples/tinyav).

CP_SPLIT_DIMS per stream: the blocks return (video, audio); the correct plan splits the video tokens and keeps the
31 audio tokens whole, declared `(1, None)`, and its CP proof checks each stream against that (summed over the
streams, the proof used to fail it: 63 tokens per rank, expected 47.5). A plan that splits the audio too fails,
naming the audio stream."""

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tinyav"
FULL = pytest.mark.full  # each run: CP or TP rows on two forked ranks of a video-and-audio pipeline (20-60 s here)


def _run(run_cli, out, plugin, *extra):
    code, stdout, err = run_cli("run", "zoo:tinyav", "--twin", "off", "--integration", EXAMPLES / plugin,
                                "--out", out, "--json", *extra)
    return code, {r["name"]: r for r in json.loads(stdout)["rows"]}


def _proof(row, feature):
    return next(p for p in row["proofs"] if p["feature"] == feature)


@FULL
def test_a_stream_kept_whole_as_declared_passes_the_cp_proof(run_cli, tmp_path):
    code, rows = _run(run_cli, tmp_path / "good", "integration.py", "--rows", "cp-ulysses-2")
    row = rows["cp-ulysses-2"]
    assert code == 0 and row["status"] == "passed", row["reasons"]
    detail = _proof(row, "cp")["detail"]
    assert "stream 0: 64 on dimension 1 split into 32 per rank" in detail, detail
    assert "stream 1: [2, 31, 32] whole on every rank, as declared" in detail, detail


@FULL
def test_an_audio_stream_split_against_the_declaration_fails_naming_it(run_cli, tmp_path):
    code, rows = _run(run_cli, tmp_path / "bad", "integration_audio_split.py", "--rows", "cp-ulysses-2",
                      "--call", "audio_frames=32")
    row = rows["cp-ulysses-2"]
    assert code == 1 and row["status"] == "failed"
    proof = _proof(row, "cp")
    assert not proof["passed"]
    assert "stream 1: declared whole (None), but [2, 16, 32] per rank against [2, 32, 32]" in proof["detail"]


def _media(run, row):
    return {Path(m).name for m in row["media"]}


@FULL
def test_every_output_is_saved_and_gated_and_a_correct_plugin_passes(run_cli, tmp_path):
    code, rows = _run(run_cli, tmp_path / "good", "integration.py", "--rows", "cp-ulysses-2,tp-2")
    assert code == 0, {n: r["reasons"] for n, r in rows.items()}
    for name in ("baseline", "cp-ulysses-2", "tp-2"):
        assert {"output.gif", "output_audio.wav"} <= _media(tmp_path, rows[name]) or \
            {"output.mp4", "output_audio.wav"} <= _media(tmp_path, rows[name])
        assert (tmp_path / "good" / "rows" / name / "output_audio.npy").is_file()
    for name in ("cp-ulysses-2", "tp-2"):
        audio = rows[name]["verdict"]["outputs"]["audio"]
        assert audio["judged"] and audio["passed"] and audio["modality"] == "audio", audio
        assert {c["metric"] for c in audio["checks"]} >= {"mel_psnr", "si_sdr", "max_abs"}
    assert "calibration" in rows  # an audio output is judged against the calibration row's floor
    report = (tmp_path / "good" / "report.md").read_text()
    assert "## Every output of the call" in report and "tp-2 / audio (audio gate)" in report
    import jsonschema

    from ditgate.core.paths import checklists_dir

    jsonschema.validate(json.loads((tmp_path / "good" / "report.json").read_text()),
                        json.loads((checklists_dir() / "report.schema.json").read_text()))


@FULL
@pytest.mark.parametrize("plugin, row", [("integration_audio_local_video.py", "cp-ulysses-2"),
                                         ("integration_tp_audio_lost.py", "tp-2")])
def test_an_audio_fault_behind_exact_frames_fails_on_the_audio_gate(run_cli, tmp_path, plugin, row):
    code, rows = _run(run_cli, tmp_path / "bad", plugin, "--rows", row, "--no-diff")
    found = rows[row]
    assert code == 1 and found["status"] == "failed"
    assert found["metrics"]["max_abs"] < 1e-5  # the frames match: their gate alone passed this row (it did before)
    assert not found["verdict"]["outputs"]["audio"]["passed"]
    assert found["reasons"] and all(r.startswith("audio output (audio): ") for r in found["reasons"]), found["reasons"]
    assert any("max-abs error" in r and "tensor rule on the output" in r for r in found["reasons"])


@FULL
def test_an_output_its_gate_cannot_measure_is_said_so(run_cli, tmp_path):
    """4 audio latent frames make 1024 samples, too short for the mel SSIM: the audio is not judged, and says why."""
    code, rows = _run(run_cli, tmp_path / "short", "integration.py", "--rows", "tp-2", "--call", "audio_frames=4")
    audio = rows["tp-2"]["verdict"]["outputs"]["audio"]
    assert code == 0 and not audio["judged"] and "cannot measure output 'audio'" in audio["why"], audio
    assert "tp-2 / audio: not judged" in (tmp_path / "short" / "report.md").read_text()


@FULL
def test_the_audio_output_is_calibrated_in_reduced_precision(run_cli, tmp_path):
    code, rows = _run(run_cli, tmp_path / "bf16", "integration.py", "--rows", "tp-2", "--dtype", "bfloat16")
    audio = rows["tp-2"]["verdict"]["outputs"]["audio"]
    assert audio["judged"] and audio["floor"], audio  # thresholds from the calibration row's audio in bfloat16
    assert audio["passed"] and rows["tp-2"]["status"] == "passed", rows["tp-2"]["reasons"]


def test_further_outputs_are_read_beside_the_first_and_an_unknown_array_is_said_so():
    """Fast: what ditgate.run.exec.outputs reads from an output object with frames, audio and an unknown tensor."""
    from dataclasses import dataclass

    import numpy as np
    import torch
    from diffusers.utils import BaseOutput

    from ditgate.run.exec.outputs import decoded, further

    @dataclass
    class Output(BaseOutput):
        frames: object
        audio: object = None
        keyframes: object = None

    out = Output(frames=np.zeros((1, 4, 16, 16, 3)), audio=torch.ones(1, 2, 8000), keyframes=torch.zeros(1, 2, 3))
    assert decoded(out)[1] == "video"
    found = further(out)
    assert found["audio"]["modality"] == "audio" and found["audio"]["output"].shape == (2, 8000)
    assert "cannot be judged" in found["keyframes"]["why"] and "output" not in found["keyframes"]
    assert further(Output(frames=np.zeros((1, 4, 16, 16, 3)))) == {}
    assert set(further((np.zeros((1, 16, 16, 3)), np.zeros((1, 2, 8000))))) == {"item1"}
