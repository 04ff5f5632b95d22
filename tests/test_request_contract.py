"""The runtime contract for any pipeline: what every command can pass to a pipeline and read back from it.

Pipelines that do things their own way (tests/pipelines/contract_pipelines.py, each TinyMM behind another
`__call__`): no step callback, a bare array, a tuple, a frame count named `video_length`, steps only in the
signature. Each runs every default row; a known-broken CP plugin still fails on the tensor rule without a
callback; a row that cannot get the final latents does not pass.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ditgate import zoo
from ditgate.core import request
from ditgate.core.model import Model
from ditgate.core.errors import DitgateError
from ditgate.run.define import rows
from ditgate.run.exec.outputs import decoded
from ditgate.run.runner import RunConfig, run

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "examples" / "tinymm" / "integration.py"
MASK_NOT_REORDERED = ROOT / "examples" / "tinymm" / "integration_mask_not_reordered.py"
PIPELINES = Path(__file__).parent / "pipelines"


@pytest.fixture(autouse=True)
def _contract_pipelines(monkeypatch):
    monkeypatch.syspath_prepend(str(PIPELINES))


def _folder(tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    """A copy of the zoo:tinymm folder whose ditgate.json call lacks `drop` (as a user's folder would)."""
    target = tmp_path / "tinymm"
    shutil.copytree(zoo.materialize("zoo:tinymm"), target)
    meta_file = target / zoo.META_FILE
    meta = json.loads(meta_file.read_text())
    meta["call"] = {k: v for k, v in meta["call"].items() if k not in drop}
    meta_file.write_text(json.dumps(meta))
    return target


def _run(model, pipeline, out, names=None, integration=GOOD, **named):
    opened = Model.open(str(model), pipeline=f"contract_pipelines:{pipeline}", **named)
    cfg = RunConfig(model=opened, rows=rows.select(rows.DEFAULT_ROWS, names), out=out, integration=integration)
    report = run(cfg, progress=lambda line: None)
    return report, {r["name"]: r for r in report["rows"]}


def _all_passed(report, by_name):
    failed = {n: r["reasons"] for n, r in by_name.items() if r["status"] not in ("passed", "reference")}
    assert report["passed"] and not failed, failed


# -- no callback: the latents come from the scheduler ------------------------------------------------------------
def test_no_callback_pipeline_still_gates_latents_and_catches_the_mask_fault(tmp_path):
    report, by_name = _run("zoo:tinymm", "NoCallbackPipeline", tmp_path / "good", ["cache", "cp-ulysses-2"])
    _all_passed(report, by_name)
    facts = json.loads((tmp_path / "good" / "rows" / "cp-ulysses-2" / "result.json").read_text())["facts"]
    assert facts["latents_from"] == "scheduler" and facts["scheduler_steps"] == 8
    assert by_name["cp-ulysses-2"]["metrics"]["max_abs"] is not None

    report, by_name = _run("zoo:tinymm", "NoCallbackPipeline", tmp_path / "bad", ["cp-ulysses-2"],
                           integration=MASK_NOT_REORDERED)
    assert not report["passed"]
    assert any("latent max-abs" in r for r in by_name["cp-ulysses-2"]["reasons"])


def test_a_row_without_final_latents_does_not_pass(tmp_path):
    report, by_name = _run("zoo:tinymm", "SelfSteppingPipeline", tmp_path / "run", ["cp-ulysses-2"])
    row = by_name["cp-ulysses-2"]
    assert row["status"] == "failed" and not report["passed"]
    assert any("could not run" in r and "no final latents" in r for r in row["reasons"]), row["reasons"]
    assert (tmp_path / "run" / "report.json").is_file()  # the report is written all the same


# -- outputs and arguments of every form: every default row ---------------------------------------------------
@pytest.mark.full  # fast tier: the no-callback pipeline's rows, outputs of every form, the request unit tests
def test_array_pipeline_with_steps_from_its_signature(tmp_path):
    folder = _folder(tmp_path, drop=("num_inference_steps", "max_sequence_length"))
    report, by_name = _run(folder, "ArrayPipeline", tmp_path / "run")
    _all_passed(report, by_name)
    assert report["request"]["call"]["num_inference_steps"] == 6
    assert report["request"]["steps_from"] == "signature"
    assert "6 steps (the pipeline's default)" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.full
def test_tuple_pipeline(tmp_path):
    report, by_name = _run("zoo:tinymm", "TuplePipeline", tmp_path / "run")
    _all_passed(report, by_name)


@pytest.mark.full
def test_frames_go_under_the_signature_name(tmp_path):
    folder = _folder(tmp_path, drop=("max_sequence_length",))
    report, by_name = _run(folder, "ClipPipeline", tmp_path / "run", frames=3)
    _all_passed(report, by_name)
    assert report["request"]["call"]["video_length"] == 3 and "num_frames" not in report["request"]["call"]
    assert by_name["cache"]["metrics"]["psnr_frame_min"] is not None  # gated as a video
    assert "3 frames of 64x64" in (tmp_path / "run" / "report.md").read_text()


# -- the request object ----------------------------------------------------------------------------------------
def test_nothing_is_added_to_the_call():
    req = request.build({})
    assert req.call == {"prompt": request.DEFAULT_PROMPT}


def test_call_options_files_and_their_order(tmp_path):
    yaml_file = tmp_path / "call.yaml"
    yaml_file.write_text("guidance_scale: 2.5\nmax_sequence_length: 16\n")
    extra = request.read_call_file(yaml_file) | request.parse_call_options(["guidance_scale=1.5", "prompt=a cat",
                                                                            "max_sequence_length=[1, 2]"])
    assert extra == {"guidance_scale": 1.5, "max_sequence_length": [1, 2], "prompt": "a cat"}
    req = Model.open("zoo:tinymm", call={"guidance_scale": 7.0}, call_file=yaml_file, steps=3).request
    assert req.call["guidance_scale"] == 7.0 and req.call["max_sequence_length"] == 16 and req.steps == 3
    with pytest.raises(DitgateError, match="KEY=VALUE"):
        request.parse_call_options(["no-equals"])
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(DitgateError, match="mapping"):
        request.read_call_file(bad)


def test_frames_and_arguments_the_pipeline_does_not_take_are_refused():
    with pytest.raises(DitgateError, match="takes no frame count"):
        Model.open("zoo:tinymm", frames=4).request
    with pytest.raises(DitgateError, match="does not accept not_an_argument"):
        Model.open("zoo:tinymm", call={"not_an_argument": 1}).request


def test_cli_user_errors_exit_2_with_one_line(run_cli, tmp_path):
    for args, words in ((["--frames", "4"], "frame count"), (["--call", "oops"], "KEY=VALUE"),
                        (["--call", "bogus=1"], "bogus"), (["--call-file", str(tmp_path / "none.json")], "cannot"),
                        (["--image", str(tmp_path / "none.png")], "no such file")):
        code, out, err = run_cli("run", "zoo:tinymm", "--rows", "cache", "--out", str(tmp_path / "o"), *args)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)


def test_an_input_image_goes_to_the_signature_argument(tmp_path):
    from diffusers import FluxKontextPipeline, WanImageToVideoPipeline

    kontext = request.resolve(request.build({}, height=32, width=48), FluxKontextPipeline)
    assert kontext.image_key == "image" and kontext.image == "generated"  # an edit pipeline needs one
    picture = request.input_image(kontext)
    assert picture.size == (48, 32) and np.asarray(picture).std() > 10  # structure, not a flat colour
    photo = tmp_path / "photo.png"
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(photo)
    i2v = request.resolve(request.build({}, image=str(photo)), WanImageToVideoPipeline)
    assert i2v.image_key == "image" and np.asarray(request.input_image(i2v)).max() == 200
    with pytest.raises(DitgateError, match="takes no input image"):
        Model.open("zoo:tinymm", image=str(photo)).request


# -- outputs of every form ---------------------------------------------------------------------------------------
def test_outputs_of_every_form():
    from diffusers.pipelines.pipeline_utils import AudioPipelineOutput, ImagePipelineOutput

    rng = np.random.default_rng(0)
    image = rng.random((1, 8, 12, 3), dtype=np.float32)
    pil = Image.fromarray((image[0] * 255).round().astype(np.uint8))
    for out in (image, torch.from_numpy(image), (image,), ImagePipelineOutput(images=image), [pil], (([pil]),),
                torch.from_numpy(image).permute(0, 3, 1, 2)):
        array, modality = decoded(out)
        assert modality == "image" and array.shape == (8, 12, 3), type(out)
        assert np.abs(array - image[0]).max() < (1 / 255 if out is not image else 1e-7)
    video = rng.random((1, 3, 8, 12, 3), dtype=np.float32)
    assert decoded(video)[1] == "video" and decoded(video)[0].shape == (3, 8, 12, 3)
    frames = [[Image.fromarray((f * 255).astype(np.uint8)) for f in video[0]]]
    assert decoded(frames)[0].shape == (3, 8, 12, 3)
    wave = rng.standard_normal((1, 2, 4000)).astype(np.float32)
    for out in (AudioPipelineOutput(audios=wave), torch.from_numpy(wave), {"audio": wave}):
        array, modality = decoded(out)
        assert modality == "audio" and array.shape == (2, 4000)
    with pytest.raises(DitgateError, match="holds no images"):
        decoded(object())


def test_sample_rate_under_the_names_real_audio_models_use():
    from types import SimpleNamespace

    from ditgate.run.exec.audio import AudioLayoutError, sample_rate

    assert sample_rate(SimpleNamespace(vae=SimpleNamespace(config=SimpleNamespace(sample_rate=24000)))) == 24000
    assert sample_rate(SimpleNamespace(vae=SimpleNamespace(config=SimpleNamespace()), sample_rate=16000)) == 16000
    with pytest.raises(AudioLayoutError, match="samples per second"):
        sample_rate(SimpleNamespace(vae=SimpleNamespace(config=SimpleNamespace())))


# -- inspect sees the user's call ---------------------------------------------------------------------------------
def test_inspect_reports_the_call_it_is_given():
    from ditgate.inspect.anatomy import inspect_model

    default = inspect_model("zoo:flux")
    asked = inspect_model(Model.open("zoo:flux", height=64, width=96, call={"max_sequence_length": 16}, steps=2))
    assert default.sequence.image_tokens * 64 * 96 == asked.sequence.image_tokens * 128 * 128  # zoo: 128x128
    assert asked.sequence.text_tokens == 16 and default.sequence.text_tokens != 16
    assert asked.calls_by_step == [1, 1]


def test_the_test_prompt_is_left_out_where_a_pipeline_takes_none():
    from diffusers import DiTPipeline

    req = request.resolve(request.build({}), DiTPipeline)
    assert "prompt" not in req.call
    with pytest.raises(DitgateError, match="does not accept prompt"):
        request.resolve(request.build({}, prompt="a cat"), DiTPipeline)  # a prompt the user gave is never dropped


# -- what ditgate adds to the call --------------------------------------------------------------------------------
def test_only_what_the_pipeline_requires_is_added_and_it_is_listed():
    from diffusers import FluxKontextPipeline, HeliosPipeline, WanImageToVideoPipeline

    t2v = request.resolve(request.build({}, steps=4), HeliosPipeline)  # text-to-video; its `image` is optional
    assert t2v.image is None and "image" not in t2v.call and set(request.added(t2v)) == {"prompt"}
    i2v = request.resolve(request.build({"call": {"prompt": "a cat"}}), WanImageToVideoPipeline)
    listed = request.added(i2v)
    assert i2v.image == "generated" and set(listed) == {"image", "num_inference_steps"}
    assert "requires an input image" in listed["image"] and "pipeline's own default" in listed["num_inference_steps"]
    none = request.resolve(request.build({}, extra=request.parse_call_options(["image=null"])), FluxKontextPipeline)
    assert none.call["image"] is None and none.image is None and "image" not in request.added(none)


@pytest.mark.full  # fast tier: the request's own listing above
def test_report_lists_what_was_added(tmp_path, run_cli):
    folder = _folder(tmp_path, drop=("prompt",))
    code, out, err = run_cli("run", folder, "--rows", "baseline", "--out", tmp_path / "run", "--json")
    report = json.loads(out)
    assert code == 0 and set(report["added_to_call"]) == {"prompt"}, err[-2000:]
    assert "- added to the call by ditgate: `prompt`: ditgate's test prompt" in (tmp_path / "run" / "report.md").read_text()
    code, out, err = run_cli("run", "zoo:tinymm", "--rows", "baseline", "--out", tmp_path / "given", "--json")
    assert code == 0 and json.loads(out)["added_to_call"] == {}
    assert "- added to the call by ditgate: nothing" in (tmp_path / "given" / "report.md").read_text()
