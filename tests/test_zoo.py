import json

import numpy as np
import pytest
import torch

import ditgate
from diffusers import ModularPipeline
from ditgate import zoo
from ditgate.core import modular


def _generate(pipe, name, seed=0, steps=2):
    fixed = (getattr(pipe, "config", None) or {}).get("distilled_sigmas")  # a distilled schedule fixes the steps
    call = dict(zoo.get(name).call, num_inference_steps=len(fixed) if fixed else steps)
    generator = torch.Generator().manual_seed(seed)
    if isinstance(pipe, ModularPipeline):  # returns values of its state by name
        output = modular.output_name(pipe, call)[0]
        return np.asarray(pipe(**call, generator=generator, output_type="np", output=output))
    out = pipe(**call, generator=generator, output_type="np")
    return np.asarray(next(getattr(out, k) for k in ("frames", "images", "audios") if hasattr(out, k)))


@pytest.mark.parametrize("name", zoo.names())
def test_builds_saves_reloads_and_is_deterministic(name, tmp_path):
    model = zoo.get(name)
    built = model.build(0)
    assert type(built).__name__ == model.pipeline
    for component in built.components.values():
        if isinstance(component, torch.nn.Module):
            assert not component.training, f"{name}: a module is left in train mode"
    path = zoo.build(name, tmp_path / name)
    index = "modular_model_index.json" if isinstance(built, ModularPipeline) else "model_index.json"
    assert (path / index).is_file()
    meta = json.loads((path / zoo.META_FILE).read_text())
    assert meta["zoo"] == name and meta["modality"] == model.modality

    pipe = ditgate.load(path)
    assert type(pipe).__name__ == model.pipeline
    a = _generate(pipe, name, seed=0)
    b = _generate(pipe, name, seed=0)
    c = _generate(pipe, name, seed=1)
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)  # same seed, same output, bit for bit
    assert np.abs(a - c).max() > 1e-3  # another seed gives another output
    np.testing.assert_allclose(a, _generate(built, name, seed=0), atol=1e-5)  # reload changes nothing (up to layout)


@pytest.mark.parametrize("name", zoo.names())
def test_heads_and_default_sequence_divide_by_2_and_4(name):
    pipe = ditgate.load(f"zoo:{name}")
    config = pipe.transformer.config
    assert config.num_attention_heads % 4 == 0
    assert getattr(config, "num_key_value_attention_heads", 4) % 4 == 0
    # audio: the transformer takes (B, channels, frames) and prepends a token, so count tokens inside the blocks
    audio = zoo.get(name).modality == "audio"
    seen = []
    handle = (pipe.transformer.transformer_blocks[0] if audio else pipe.transformer).register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs), with_kwargs=True)
    _generate(pipe, name, steps=1)
    handle.remove()
    if "hidden_states" in seen[0]:
        shape = seen[0]["hidden_states"].shape
        tokens = [shape[1] if len(shape) == 3 else int(np.prod(shape[2:]) // 4)]  # Wan: (B, C, F, H, W), 2x2 patches
    else:  # Cosmos 3: one packed sequence, the text stream (und_len tokens) then the vision stream, split apart
        tokens = [seen[0]["und_len"], seen[0]["sequence_length"] - seen[0]["und_len"]]
    assert all(n % 4 == 0 for n in tokens), tokens


def test_different_weight_seeds_differ(tmp_path):
    a = zoo.build("flux", tmp_path / "a", seed=0)
    b = zoo.build("flux", tmp_path / "b", seed=1)
    wa = ditgate.load(a).transformer.state_dict()
    wb = ditgate.load(b).transformer.state_dict()
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


def test_build_refuses_non_empty_folder_and_keeps_it(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    with pytest.raises(ditgate.core.errors.DitgateError, match="not empty"):
        zoo.build("wan", target)
    assert (target / "precious.txt").read_text() == "keep me"
    with pytest.raises(ditgate.core.errors.DitgateError, match="no model"):  # --overwrite replaces only a model
        zoo.build("wan", target, overwrite=True)
    assert (target / "precious.txt").read_text() == "keep me"
    (target / "precious.txt").unlink()
    zoo.build("wan", target)
    zoo.build("wan", target, overwrite=True)  # a model folder is replaced
    assert (target / "model_index.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no staging folder left behind


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def broken(seed):
        raise RuntimeError("builder broke")

    monkeypatch.setitem(zoo.ZOO, "broken", zoo.ZooModel("broken", "FluxPipeline", "image", "", broken))
    with pytest.raises(RuntimeError, match="builder broke"):
        zoo.build("broken", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_unknown_zoo_name_lists_known_ones():
    with pytest.raises(ditgate.core.errors.UnknownZooModelError, match="known: flux"):
        ditgate.load("zoo:nope")


def test_zoo_cli(run_cli, tmp_path):
    code, out, _ = run_cli("zoo", "list")
    assert code == 0
    for name in zoo.names():
        assert f"zoo:{name}" in out
    code, out, _ = run_cli("zoo", "build", "flux", tmp_path / "f")
    assert code == 0 and (tmp_path / "f" / "model_index.json").is_file()
    code, _, err = run_cli("zoo", "build", "flux", tmp_path / "f")
    assert code == 2 and "not empty" in err


def test_incomplete_save_is_refused(tmp_path):
    folder = tmp_path / "partial"
    (folder / "text_encoder").mkdir(parents=True)
    (folder / "text_encoder" / "config.json").write_text("{}")
    with pytest.raises(ditgate.core.errors.DitgateError, match="no weights for text_encoder"):
        zoo._check_complete(folder)


@pytest.mark.full
def test_zoo_spec_loads_on_every_rank_of_a_fresh_torchrun(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "load.py"
    script.write_text("import torch.distributed as dist, ditgate\n"
                      "dist.init_process_group('gloo')\n"
                      "pipe = ditgate.load('zoo:wan')\n"
                      "print('rank', dist.get_rank(), 'loaded', type(pipe).__name__)\n"
                      "dist.destroy_process_group()\n")
    env = dict(os.environ, DITGATE_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("loaded WanPipeline") == 2


def test_every_ditgate_json_key_is_documented(zoo_path):
    """README's table of `ditgate.json` names every key the zoo and the twin write, and nothing the code never reads
    is described as read."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### The model folder's `ditgate.json`", 1)[1].split("\n## ", 1)[0]
    documented = {k for row in re.findall(r"^\| (`[^|]+`) \|", section, re.M) for k in re.findall(r"`(\w+)`", row)}
    written = set(json.loads((zoo_path("flux") / zoo.META_FILE).read_text()))
    written |= {"modality", "call", "vae_tiling", "twin"}  # what ditgate.twin.assemble writes
    assert written == documented, (written, documented)
