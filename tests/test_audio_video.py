"""A pipeline returning frames and audio, on fused video/audio blocks (zoo:tinyav, examples/tinyav).

CP_SPLIT_DIMS per stream: the blocks return (video, audio); the correct plan splits the video tokens and keeps the
31 audio tokens whole, declared `(1, None)`, and its CP proof checks each stream against that (summed over the
streams, the proof used to fail it: 63 tokens per rank, expected 47.5). A plan that splits the audio too fails,
naming the audio stream."""

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tinyav"
pytestmark = pytest.mark.full  # CP rows on two forked ranks of a video-and-audio pipeline (20-40 s each here)


def _run(run_cli, out, plugin, *extra):
    code, stdout, err = run_cli("run", "zoo:tinyav", "--twin", "off", "--integration", EXAMPLES / plugin,
                                "--out", out, "--json", *extra)
    return code, {r["name"]: r for r in json.loads(stdout)["rows"]}


def _proof(row, feature):
    return next(p for p in row["proofs"] if p["feature"] == feature)


def test_a_stream_kept_whole_as_declared_passes_the_cp_proof(run_cli, tmp_path):
    code, rows = _run(run_cli, tmp_path / "good", "integration.py", "--rows", "cp-ulysses-2")
    row = rows["cp-ulysses-2"]
    assert code == 0 and row["status"] == "passed", row["reasons"]
    detail = _proof(row, "cp")["detail"]
    assert "stream 0: 64 on dimension 1 split into 32 per rank" in detail, detail
    assert "stream 1: [2, 31, 32] whole on every rank, as declared" in detail, detail


def test_an_audio_stream_split_against_the_declaration_fails_naming_it(run_cli, tmp_path):
    code, rows = _run(run_cli, tmp_path / "bad", "integration_audio_split.py", "--rows", "cp-ulysses-2",
                      "--call", "audio_frames=32")
    row = rows["cp-ulysses-2"]
    assert code == 1 and row["status"] == "failed"
    proof = _proof(row, "cp")
    assert not proof["passed"]
    assert "stream 1: declared whole (None), but [2, 16, 32] per rank against [2, 32, 32]" in proof["detail"]
