"""The real configurations under src/ditgate/twin/configs: pipeline folders of flagship models, configs only.

For every folder: `model_index.json` names a pipeline and component classes the installed diffusers / transformers
have; every component with a config builds from it on the meta device (`accelerate.init_empty_weights`: no weight
is allocated) with no key its class ignores, except the ones a published file carries and the class never read
(IGNORED); each transformer's parameter count is within 5% of the published count (PUBLISHED, with its source; the
sources of every file are in src/ditgate/twin/configs/SOURCES.md).

The fast tier builds every transformer and scheduler, and the text encoders and VAEs of one image and one video
folder (FAST); the full tier builds every component of every folder.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "ditgate" / "twin" / "configs"
FOLDERS = sorted(p.name for p in CONFIGS.iterdir() if (p / "model_index.json").is_file())

# A meta-device count may differ from a rounded published one by this much (a "12B" model counts 11.9B).
TOLERANCE = 0.05

# folder -> component -> (published parameter count, where it is published)
PUBLISHED = {
    "flux1-dev": {"transformer": (12e9, "black-forest-labs/FLUX.1-dev model card: a 12 billion parameter rectified "
                                        "flow transformer")},
    "flux2-dev": {"transformer": (32e9, "black-forest-labs/FLUX.2-dev model card: a 32 billion parameter rectified "
                                        "flow transformer")},
    "wan2.1-t2v-14b": {"transformer": (14e9, "Wan-AI/Wan2.1-T2V-14B model card: the 14B model")},
    "wan2.2-t2v-a14b": {
        "transformer": (14e9, "Wan-AI/Wan2.2-T2V-A14B model card: two 14B experts (27B total, 14B active per step)"),
        "transformer_2": (14e9, "Wan-AI/Wan2.2-T2V-A14B model card: two 14B experts (27B total, 14B active per step)"),
    },
    "qwen-image": {"transformer": (20e9, "Qwen/Qwen-Image model card: a 20B MMDiT image foundation model")},
    "hunyuanvideo": {"transformer": (13e9, "tencent/HunyuanVideo model card: over 13 billion parameters")},
    "sd3.5-large": {"transformer": (8.1e9, "stabilityai/stable-diffusion-3.5-large model card: 8.1 billion "
                                           "parameters")},
    "ltx-video": {"transformer": (2e9, "Lightricks/LTX-Video model card: the 2B DiT (0.9.0)")},
    "cogvideox-5b": {"transformer": (5.575e9, "THUDM/CogVideoX-5b transformer/: bf16 shards of 9.93 GB + 1.22 GB "
                                              "= 11.15 GB, 2 bytes a parameter")},
    "hidream-i1-full": {"transformer": (17e9, "HiDream-ai/HiDream-I1 README: a 17B parameter sparse DiT (MoE)")},
    "stable-audio-open-1.0": {"transformer": (1.057e9, "Stable Audio Open, arXiv 2407.14358: the DiT has 1,057M "
                                                        "parameters")},
}

# folder -> component -> config keys a published file carries that the installed class does not read
IGNORED = {
    "qwen-image": {"transformer": {"pooled_projection_dim"}},
    "flux2-dev": {"vae": {"force_upcast"}},
}

# The folders whose text encoders and VAEs the fast tier builds (one image model, one video model).
FAST = {"flux1-dev", "wan2.2-t2v-a14b"}


def _index(folder: str) -> dict:
    return json.loads((CONFIGS / folder / "model_index.json").read_text())


def _components(folder: str) -> list[tuple[str, str, str]]:
    """(name, library, class) of every component the index names (entries of [null, null] left out)."""
    out = []
    for name, entry in _index(folder).items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2 or None in entry:
            continue
        out.append((name, entry[0], entry[1]))
    return out


def _class(library: str, name: str):
    """As diffusers resolves an index entry: diffusers, transformers, or a diffusers pipeline module."""
    if library in ("diffusers", "transformers"):
        module = importlib.import_module(library)
    else:
        module = importlib.import_module(f"diffusers.pipelines.{library}")
    return getattr(module, name, None)


def _build(cls, config: dict):
    """The component on the meta device; its parameter count."""
    import accelerate
    import diffusers

    with accelerate.init_empty_weights():
        if issubclass(cls, diffusers.ModelMixin):
            model = cls.from_config(config)
        else:
            model = cls(cls.config_class.from_dict(config))
    return sum(p.numel() for p in model.parameters())


def _cases():
    for folder in FOLDERS:
        for name, library, cls in _components(folder):
            if name.startswith("tokenizer"):
                continue  # no vocabulary files here: the twin builds an offline stand-in tokenizer
            fast = name.startswith(("transformer", "scheduler")) or folder in FAST
            marks = () if fast else (pytest.mark.full,)
            yield pytest.param(folder, name, library, cls, id=f"{folder}/{name}", marks=marks)


def test_every_folder_is_small_configs_only():
    assert len(FOLDERS) >= 7, FOLDERS
    for path in CONFIGS.rglob("*"):
        if path.is_file():
            assert path.suffix in (".json", ".md"), f"{path}: configs only"
            assert path.stat().st_size < 100_000, f"{path}: {path.stat().st_size} bytes"
    assert set(PUBLISHED) == set(FOLDERS), "every folder needs its published transformer count"


@pytest.mark.parametrize("folder", FOLDERS)
def test_index_names_installed_classes(folder):
    import diffusers

    index = _index(folder)
    pipeline = getattr(diffusers, index["_class_name"], None)
    assert pipeline is not None, index["_class_name"]
    accepted = set(inspect.signature(pipeline.__init__).parameters) - {"self"}
    named = {key for key in index if not key.startswith("_")}
    assert named <= accepted, f"{pipeline.__name__} takes no {sorted(named - accepted)}"
    missing = {name for name, p in inspect.signature(pipeline.__init__).parameters.items()
               if name != "self" and p.default is inspect.Parameter.empty} - named
    assert not missing, f"{pipeline.__name__} needs {sorted(missing)}"
    components = _components(folder)
    assert any(name == "transformer" for name, _, _ in components), "no transformer"
    for name, library, cls in components:
        assert _class(library, cls) is not None, f"{name}: {library} has no {cls}"
        if not name.startswith("tokenizer"):
            config = "scheduler_config.json" if name == "scheduler" else "config.json"
            assert (CONFIGS / folder / name / config).is_file(), f"{name}: no {config}"


def _problems(folder: str, name: str, cls, config: dict) -> list[str]:
    """What is wrong with a model component's config: keys its class ignores, a count off the published one."""
    import diffusers

    problems = []
    if issubclass(cls, diffusers.ModelMixin):
        _, unused, _ = cls.extract_init_dict(config)
        unused = {k for k in unused if not k.startswith("_")} - IGNORED.get(folder, {}).get(name, set())
        if unused:
            problems.append(f"{name}: {cls.__name__} ignores {sorted(unused)}")
    count = _build(cls, config)
    published = PUBLISHED[folder].get(name)
    if published is not None:
        expected, source = published
        if abs(count - expected) > TOLERANCE * expected:
            problems.append(f"{folder}/{name}: {count / 1e9:.3f}B parameters on the meta device, published "
                            f"{expected / 1e9:.3f}B ({source})")
    return problems


@pytest.mark.parametrize(("folder", "name", "library", "cls_name"), list(_cases()))
def test_component_builds_on_meta(folder, name, library, cls_name):
    cls = _class(library, cls_name)
    if name == "scheduler":
        if cls_name == "CosineDPMSolverMultistepScheduler":
            pytest.importorskip("torchsde", reason="diffusers builds CosineDPMSolverMultistepScheduler with torchsde only")
        config = json.loads((CONFIGS / folder / name / "scheduler_config.json").read_text())
        scheduler = cls.from_config(config)
        for key, value in config.items():
            if not key.startswith("_"):
                assert scheduler.config[key] == value, f"{key}: {scheduler.config[key]!r} != {value!r}"
        return
    config = json.loads((CONFIGS / folder / name / "config.json").read_text())
    assert _problems(folder, name, cls, config) == []


def test_planted_faults_are_caught():
    """A misspelled key (the class would build with its default) and a wrong depth both fail the check."""
    import diffusers

    config = json.loads((CONFIGS / "flux1-dev" / "transformer" / "config.json").read_text())
    cls = diffusers.FluxTransformer2DModel
    assert _problems("flux1-dev", "transformer", cls, config) == []
    typo = dict(config)
    typo["num_single_layer"] = typo.pop("num_single_layers")  # the default (38) hides it: only the key check sees it
    assert any("ignores ['num_single_layer']" in p for p in _problems("flux1-dev", "transformer", cls, typo))
    shallow = dict(config, num_single_layers=30)  # 38 -> 30 single blocks: 11.9B -> 10.2B
    assert any("published 12.000B" in p for p in _problems("flux1-dev", "transformer", cls, shallow))


@pytest.mark.full  # builds the twin's components until the scheduler's import fails: about 11 s
def test_a_library_a_component_needs_is_named_in_one_line(run_cli, tmp_path):
    """Stable Audio Open's scheduler needs torchsde: without it the twin (and any command loading the model) ends in
    one line naming the library, exit 2, not a traceback."""
    try:
        import torchsde  # noqa: F401
        pytest.skip("torchsde is installed here")
    except ImportError:
        pass
    code, _, err = run_cli("twin", str(CONFIGS / "stable-audio-open-1.0"), str(tmp_path / "out"))
    assert code == 2 and "torchsde" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()  # nothing half-built left behind
