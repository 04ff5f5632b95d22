"""Real diffusers pipelines the runtime was not written around (`zoo:pipe/NAME`), through `ditgate inspect` and the
cache row: the CI subset of benchmarks/pipeline_survey.py.

The subset spans block layouts (joint MM-DiT blocks, cross-attention blocks, expert-AdaLN joint blocks, packed video
tokens), CFG styles (batched, separate calls), a video and an image-to-video pipeline (given `--image`), one CP
row, and a registered adapter that is broken.
"""

import json

import pytest

from ditgate import zoo
from ditgate.core.errors import UnknownZooModelError
from ditgate.zoo import pipelines

# name -> (cache-dit family, transformer calls per step, what it stands for)
SUBSET = {
    "pipe/sd3": ("StableDiffusion3", 1, "joint blocks, three text encoders, batched CFG"),
    "pipe/cogview4": ("CogView4", 2, "joint-sequence blocks, a GLM encoder, CFG as separate calls"),
    "pipe/pixart-sigma": ("PixArt", 1, "cross-attention blocks with AdaLN-single, batched CFG"),
    "pipe/ltx": ("LTX", 1, "video: packed spatio-temporal tokens"),
    "pipe/ltx-i2v": ("LTX", 1, "image-to-video: the input image's latents held by a per-token timestep mask"),
}


def _image_args(name, tmp_path):
    """`--image FILE` for the pipelines that take an input image (a seeded gradient, as a user's photo would be)."""
    if not pipelines.PIPELINES[name.removeprefix(pipelines.PREFIX)].image:
        return []
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:32, 0:32]
    path = tmp_path / "input.png"
    Image.fromarray(np.stack([x * 8, y * 8, 255 - (x + y) * 4], -1).clip(0, 255).astype(np.uint8)).save(path)
    return ["--image", path]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each subset pipeline saved once with `zoo.build` (save_pretrained), as `ditgate zoo build` does."""
    root = tmp_path_factory.mktemp("pipelines")
    return {name: zoo.build(name, root / name.replace("/", "+")) for name in SUBSET}


def test_every_pipeline_is_a_diffusers_class_of_a_cache_dit_family_or_says_it_is_not():
    import diffusers
    from cache_dit.caching.block_adapters import BlockAdapterRegister

    prefixes = BlockAdapterRegister.supported_pipelines()[1]
    assert len(set(pipelines.PIPELINES)) == len(pipelines.SPECS)
    for spec in pipelines.SPECS:
        assert hasattr(diffusers, spec.pipeline), spec.pipeline
        registered = any(spec.pipeline.startswith(p) for p in prefixes)
        assert registered == spec.family, f"{spec.pipeline}: cache-dit family {registered}, the zoo says {spec.family}"
        assert spec.modality in ("image", "video") and spec.call.get("num_inference_steps")
    assert zoo.get("zoo:pipe/ltx").pipeline == "LTXPipeline"
    with pytest.raises(UnknownZooModelError, match="pipe/ltx"):  # an unknown name lists the pipeline zoo
        zoo.get("zoo:pipe/no-such")


def test_zoo_cli_lists_and_builds_pipelines(run_cli, tmp_path):
    code, out, _ = run_cli("zoo", "list", "--pipelines")
    assert code == 0 and all(f"zoo:{name} " in out for name in pipelines.names())
    code, out, _ = run_cli("zoo", "list")
    assert code == 0 and "zoo:pipe/" not in out  # the core zoo's listing is unchanged
    code, out, _ = run_cli("zoo", "build", "pipe/sd3", tmp_path / "sd3")
    assert code == 0 and (tmp_path / "sd3" / "model_index.json").is_file()
    assert json.loads((tmp_path / "sd3" / zoo.META_FILE).read_text())["zoo"] == "pipe/sd3"


@pytest.mark.parametrize("name", SUBSET)
def test_inspect_finds_the_adapter_and_the_cfg_style(name, folders, run_cli):
    family, calls, _ = SUBSET[name]
    code, out, err = run_cli("inspect", folders[name], "--json")  # an input image: ditgate's seeded one
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["cache_dit"]["adapter"]["prefix"] == family
    assert report["block_lists"] and all(b["length"] >= 2 for b in report["block_lists"])
    assert report["calls_per_step"] == calls
    assert report["has_separate_cfg"] is (calls == 2)


@pytest.mark.parametrize("name", SUBSET)
def test_cache_row_passes(name, folders, run_cli, tmp_path):
    image = _image_args(name, tmp_path)
    code, out, err = run_cli("run", folders[name], "--rows", "cache", "--out", tmp_path / "run", *image)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["request"].get("image_key") == ("image" if image else None)
    rows = {r["name"]: r for r in report["rows"]}
    assert code == 0, (rows.get("cache", {}).get("reasons"), err[-2000:])
    cache = rows["cache"]
    assert cache["status"] == "passed"
    assert any(p["feature"] == "cache" and p["passed"] and "cached steps" in p["detail"] for p in cache["proofs"])


def test_ulysses_row_passes_on_separate_cfg_calls(folders, run_cli, tmp_path):
    code, _, err = run_cli("run", folders["pipe/cogview4"], "--rows", "cp-ulysses-2", "--out", tmp_path / "run")
    rows = {r["name"]: r for r in json.loads((tmp_path / "run" / "report.json").read_text())["rows"]}
    assert code == 0, (rows["cp-ulysses-2"].get("reasons"), err[-2000:])
    proofs = rows["cp-ulysses-2"]["proofs"]
    assert any(p["feature"] == "cp" and p["passed"] and "per rank" in p["detail"] for p in proofs)


def test_a_broken_registered_adapter_fails_the_cache_row(run_cli, tmp_path):
    """cache-dit 1.5.3's `Bria` adapter declares Pattern_0 for blocks that return (encoder, hidden) states
    (Pattern_1): the cached forward breaks on the shapes, and the row fails with that error rather than passing."""
    path = zoo.build("pipe/bria", tmp_path / "bria")
    code, _, _ = run_cli("run", path, "--rows", "cache", "--out", tmp_path / "run")
    rows = {r["name"]: r for r in json.loads((tmp_path / "run" / "report.json").read_text())["rows"]}
    assert code == 1 and rows["baseline"]["status"] == "reference"
    assert rows["cache"]["status"] != "passed"
    assert "must match the size of tensor" in " ".join(rows["cache"]["reasons"])
