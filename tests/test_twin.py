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


ZERO_INIT_MODULE = '''
import functools

from diffusers import FluxTransformer2DModel


class ZeroOutFlux(FluxTransformer2DModel):
    """FLUX's transformer initialised as adaLN-zero DiTs are: output layer and output modulation at zero."""

    @functools.wraps(FluxTransformer2DModel.__init__)  # keeps the signature diffusers reads the config by
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for layer in (self.proj_out, self.norm_out.linear):
            layer.weight.data.zero_()
            layer.bias.data.zero_()
'''


@pytest.mark.full
def test_a_source_that_zero_initialises_its_output_still_discriminates(run_cli, zoo_path, tmp_path):
    """The source class zeroes its output layer, so built from its own init it outputs a constant and no fault
    could show in it; the twin draws those layers again, and a CP fault that raises nothing (the position table
    restarted on each rank) fails on the twin's tensor rule."""
    import torch

    source = configs_only(zoo_path("flux"), tmp_path / "zero-flux")
    (source / "transformer" / "zeroflux.py").write_text(ZERO_INIT_MODULE)  # where diffusers loads custom code
    index = json.loads((source / "model_index.json").read_text())
    index["transformer"] = ["zeroflux", "ZeroOutFlux"]
    (source / "model_index.json").write_text(json.dumps(index))
    cfg = config(source, "transformer") | {"_class_name": "ZeroOutFlux"}
    (source / "transformer" / "config.json").write_text(json.dumps(cfg))

    import importlib.util
    spec = importlib.util.spec_from_file_location("zeroflux", source / "transformer" / "zeroflux.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    own = module.ZeroOutFlux.from_config({k: v for k, v in cfg.items() if not k.startswith("_")})
    assert not own.proj_out.weight.any()  # the source's own init: a constant output

    code, _, err = run_cli("twin", source, tmp_path / "no-consent")
    assert code == 2 and "--trust-remote-code" in err, err
    made = twin_json(run_cli, source, tmp_path / "twin", "--trust-remote-code")
    notes = " ".join(n for c in made["components"] for n in c.get("notes", []))
    assert "zero-initialised" in notes and "proj_out" in notes, notes
    assert made["checks"]["output_change"] > 1e-3
    twin = module.ZeroOutFlux.from_pretrained(tmp_path / "twin" / "transformer")
    assert torch.count_nonzero(twin.proj_out.weight) == twin.proj_out.weight.numel()

    plugins = __import__("pathlib").Path(__file__).parent / "plugins"
    code, out, err = run_cli("run", tmp_path / "twin", "--trust-remote-code", "--rows", "cp-ulysses-2",
                             "--integration", plugins / "flux_cp_rope_restarted.py", "--out", tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    row = next(r for r in report["rows"] if r["name"] == "cp-ulysses-2")
    assert code == 1 and row["status"] == "failed", (row, err[-2000:])
