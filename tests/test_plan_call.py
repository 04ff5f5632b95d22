"""The draft plan's Check commands make the inspected call (a test runs one), state and use the sizes where CP and
VAE-P act, and a call at the pipeline's defaults is announced with its estimated cost."""

import json
import re
import shlex
from pathlib import Path

import pytest

from ditgate.core.model import Model
from ditgate.inspect.anatomy import inspect_model
from ditgate.inspect.plan import call as plan_call

CONFIGS = Path(plan_call.__file__).resolve().parents[2] / "twin" / "configs"


@pytest.fixture(scope="module")
def flux_small():
    """zoo:flux inspected at a call of its own: 24x24 (36 tokens, one 32-pixel VAE tile), 2 steps, seed 7."""
    model = Model.open("zoo:flux", height=24, width=24, steps=2, seed=7, prompt="a cat on a mat",
                       call={"guidance_scale": 2.5})
    return model, inspect_model(model)


def _checks(plan: str) -> dict[str, list[str]]:
    """The plan's Check commands by their --rows value, split into arguments."""
    out = {}
    for command in re.findall(r"Check: `([^`]+)`", plan):
        args = shlex.split(command)
        out[args[args.index("--rows") + 1]] = args
    return out


@pytest.mark.full
def test_the_cache_command_runs_the_inspected_call(flux_small, run_cli, tmp_path):
    model, anatomy = flux_small
    args = _checks(anatomy.plan)["baseline,cache"]
    assert args[:3] == ["ditgate", "run", "zoo:flux"]
    code, _, err = run_cli(*args[1:], "--out", tmp_path / "run", "-q")
    assert code in (0, 1), err
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    ran = report["request"]
    assert ran["call"] == model.request.call and ran["seed"] == 7
    assert report["dtype"] == model.dtype == "float32"
    assert ran["call"]["num_inference_steps"] == 2 and ran["call"]["guidance_scale"] == 2.5


def test_the_sizes_where_cp_and_vaep_act(flux_small):
    _, anatomy = flux_small
    sizes = anatomy.sizes
    assert sizes["tokens"] == 36 and sizes["tile"] == 32
    assert tuple(sizes["cp"]) == (24, 32)  # 48 tokens: 2, 4 and 8 ranks
    assert tuple(sizes["vaep"]) == (24, 36)  # wider than one 32-pixel tile
    assert "the smallest size with two tiles is 24x36" in anatomy.plan
    checks = _checks(anatomy.plan)
    for rows, size in (("baseline,tp-2+vaep", ["24", "36"]), ("baseline,cp-ulysses-2,cp-ring-2", ["24", "32"]),
                       ("baseline,tp-2", ["24", "24"])):
        args = checks[rows]
        assert [args[args.index("--height") + 1], args[args.index("--width") + 1]] == size, rows
        assert args.count("--height") == 1 and "--seed" in args and "--steps" in args


def test_request_args_read_back_as_the_same_request():
    import argparse

    from ditgate.commands.model.options import add_model_arguments, model_from

    model = Model.open("zoo:wan", frames=5, steps=3, seed=4, call={"guidance_scale": 1.5, "negative_prompt": "true"},
                       prompt="it's a \"quoted\" prompt")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    again = model_from(parser.parse_args(["zoo:wan", *shlex.split(shlex.join(plan_call.request_args(model)))]))
    assert again.request.call == model.request.call and again.request.seed == 4 and again.dtype == model.dtype


def test_a_default_call_is_announced_with_its_cost():
    from diffusers import WanPipeline

    pipe = WanPipeline.__new__(WanPipeline)  # the class's signature and defaults; no weights needed
    folder = CONFIGS / "wan2.1-t2v-14b"
    model = Model.open(folder)
    line = plan_call.default_cost(model, pipe, dict(model.request.call), 120)
    assert line and "81 frames of 480x832, 50 steps" in line and "height, width, steps" in line
    assert re.search(r"about [\d.]+ (h|min)", line)
    small = Model.open(folder, height=64, width=64, frames=5, steps=2)
    assert plan_call.default_cost(small, pipe, dict(small.request.call), 120) is None  # the user's call
