"""`ditgate twin`: from a folder of configs and tokenizers alone, a loadable float32 copy with the source's widths
and fewer blocks, whose output depends on its input; every kind of pipeline; bad input refused in one line.

The fast tier twins a configs-only copy of zoo:flux (the build loads the twin and runs its call: that is its own
check) and refuses bad input without building anything; the full tier twins a video, an audio, a modular, a custom,
and a two-transformer pipeline, and a source whose own initialisation zeroes its output layers.
"""

import json
import shutil

import pytest

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def configs_only(source, dest):
    """A copy of a model folder without one weight file: what a user has before downloading the weights."""
    shutil.copytree(source, dest, ignore=lambda folder, names: [n for n in names if n.endswith(WEIGHTS)])
    assert not [p for p in dest.rglob("*") if p.name.endswith(WEIGHTS)]
    return dest


def config(folder, component):
    return json.loads((folder / component / "config.json").read_text())


def twin_json(run_cli, source, out, *extra):
    code, stdout, err = run_cli("twin", source, out, "--json", *extra)
    assert code == 0, err
    return json.loads(stdout)


def test_configs_and_tokenizers_alone_make_a_twin_with_the_same_widths(run_cli, zoo_path, tmp_path):
    source = configs_only(zoo_path("flux"), tmp_path / "flux-configs")
    made = twin_json(run_cli, source, tmp_path / "twin")
    twin = tmp_path / "twin"
    before, after = config(source, "transformer"), config(twin, "transformer")
    for width in ("num_attention_heads", "attention_head_dim", "joint_attention_dim", "in_channels", "patch_size",
                  "pooled_projection_dim", "axes_dims_rope"):
        assert after[width] == before[width], width
    assert (after["num_layers"], after["num_single_layers"]) == (1, 1) < (before["num_layers"],
                                                                        before["num_single_layers"])
    assert config(twin, "vae")["latent_channels"] == config(source, "vae")["latent_channels"]
    assert any(p.name.endswith(".safetensors") for p in (twin / "transformer").iterdir())
    # the build ran the twin at its call: every feature can act, and the output depends on the input
    assert made["checks"]["calls"] == {"transformer": made["call"]["num_inference_steps"]}
    assert made["checks"]["output_change"] > 1e-3
    assert made["params"] < 1_000_000 and made["modality"] == "image"
    assert json.loads((twin / "ditgate.json").read_text())["call"]["height"] == made["call"]["height"]


@pytest.mark.parametrize("case, words", [
    ("missing", "does not exist"),
    ("bad-config", "config.json"),
    ("out-holds-a-model", "--overwrite"),
    ("bf16", "float32"),
    ("gpu", "CPU"),
])
def test_bad_input_is_refused_in_one_line(run_cli, zoo_path, tmp_path, case, words):
    source, out, extra = zoo_path("flux"), tmp_path / "twin", []
    if case == "missing":
        source = tmp_path / "nowhere"
    elif case == "bad-config":
        source = configs_only(zoo_path("flux"), tmp_path / "broken")
        (source / "transformer" / "config.json").write_text("{not json")
    elif case == "out-holds-a-model":
        shutil.copytree(zoo_path("flux"), out)
    elif case == "bf16":
        extra = ["--dtype", "bf16"]
    else:
        extra = ["--device", "cuda"]
    code, stdout, err = run_cli("twin", source, out, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert words.lower() in err.lower(), err
    if case != "out-holds-a-model":
        assert not out.exists()


@pytest.mark.full
@pytest.mark.parametrize("name, modality, lists", [
    ("wan", "video", ["blocks"]),
    ("stable-audio", "audio", ["transformer_blocks"]),
    ("flux3", "image", ["single_transformer_blocks"]),  # a modular-only pipeline (modular_model_index.json)
    ("tinyst", "video", ["spatial_blocks", "temporal_blocks"]),  # a custom pipeline: factorized blocks stay pairs
    ("pipe/wan22", "video", ["blocks"]),  # two transformers: both twinned
])
def test_every_kind_of_pipeline_twins(run_cli, zoo_path, tmp_path, name, modality, lists):
    source = configs_only(zoo_path(name), tmp_path / "source")
    made = twin_json(run_cli, source, tmp_path / "twin")
    assert made["modality"] == modality
    cut = {c["list"]: c for comp in made["components"] for c in comp.get("cuts", [])}
    for block_list in lists:
        assert cut[block_list]["after"] < cut[block_list]["before"], cut[block_list]
    assert made["checks"]["output_change"] > 1e-3
    if name == "pipe/wan22":
        calls = made["checks"]["calls"]
        assert set(calls) == {"transformer", "transformer_2"} and all(calls.values()), calls
        assert config(tmp_path / "twin", "transformer_2")["num_attention_heads"] == \
            config(source, "transformer_2")["num_attention_heads"]
