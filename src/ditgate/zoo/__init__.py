"""The offline model zoo: tiny, seeded, real diffusers pipelines.

`zoo:NAME` is accepted wherever a model path is. The first use builds the model into the zoo cache
(`$DITGATE_HOME/zoo`, default `~/.cache/ditgate/zoo`) with `save_pretrained`; every later use loads that folder
through the same `from_pretrained(path)` call a real model goes through. `zoo:pipe/NAME` names one of the tiny
copies of real diffusers pipelines in `ditgate.zoo.pipelines`, one or more per model family cache-dit registers
(`ditgate zoo list --pipelines`).

May import: `ditgate.core.errors` and `ditgate.core.examples` only (the loader imports the zoo).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core.errors import DitgateError, UnknownZooModelError
from ditgate.zoo import builders, modular_builders, modular_video, pipelines, publish

ZOO_PREFIX = "zoo:"
ZOO_FORMAT = 2  # bump when a builder changes, so cached folders are rebuilt
META_FILE = "ditgate.json"


@dataclass(frozen=True)
class ZooModel:
    name: str
    pipeline: str
    modality: str  # "image" | "video" | "audio"
    summary: str
    build: Callable[[int], Any] = field(repr=False)
    call: dict[str, Any] = field(default_factory=dict)  # default pipeline call arguments
    vae_tiling: dict[str, Any] = field(default_factory=dict)  # arguments of vae.enable_tiling() for tiled rows


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("flux", "FluxPipeline", "image",
                 "FLUX.1 layout: 2 double + 4 single blocks, 4 heads; CLIP + T5; 128x128 -> 1024 tokens",
                 builders.build_flux,
                 {"prompt": "a tiny red cube on a table", "height": 128, "width": 128,
                  "num_inference_steps": 8, "guidance_scale": 3.5, "max_sequence_length": 32}),
        ZooModel("wan", "WanPipeline", "video",
                 "Wan 2.1 T2V layout: 4 blocks, 4 heads; UMT5; 9 frames of 64x64 -> 48 tokens",
                 builders.build_wan,
                 {"prompt": "a tiny red cube spinning", "negative_prompt": "blurry", "height": 64, "width": 64,
                  "num_frames": 9, "num_inference_steps": 8, "guidance_scale": 5.0, "max_sequence_length": 16},
                 # 64x64 frames would decode in one tile at the default 256-pixel tiles: 32-pixel tiles make 3x3
                 vae_tiling={"tile_sample_min_height": 32, "tile_sample_min_width": 32,
                             "tile_sample_stride_height": 24, "tile_sample_stride_width": 24}),
        ZooModel("qwen-image", "QwenImagePipeline", "image",
                 "Qwen-Image layout: 4 blocks, 4 heads; Qwen2.5-VL text encoder; true CFG (2 calls per step)",
                 builders.build_qwen_image,
                 {"prompt": "a tiny red cube on a table", "negative_prompt": "blurry", "height": 128, "width": 128,
                  "num_inference_steps": 8, "true_cfg_scale": 2.0, "max_sequence_length": 64}),
        ZooModel("stable-audio", "StableAudioPipeline", "audio",
                 "Stable Audio Open layout: 4 blocks, 8 heads (4 KV); T5; fixed 31-frame window at 44.1 kHz -> "
                 "32 block tokens; batched CFG",
                 builders.build_stable_audio,
                 {"prompt": "a tiny drum loop", "audio_end_in_s": 0.25, "num_inference_steps": 8,
                  "guidance_scale": 7.0}),
        # A diffusers ModularPipeline with no standard pipeline class (ditgate.zoo.modular_builders).
        ZooModel("flux3", "Flux3ModularPipeline", "image",
                 "FLUX.3 layout (modular only): 1 per-mode + 2 joint blocks, 4 heads; Qwen3-VL text encoder, Qwen3.5 "
                 "prompt upsampler; CFG guider (2 calls per step); 64x64 -> 256 image + 80 text tokens",
                 modular_builders.build_flux3,
                 {"prompt": "a tiny red cube on a table", "height": 64, "width": 64, "num_inference_steps": 8,
                  "max_new_tokens": 8, "text_encoder_out_layers": list(modular_builders.FLUX3_TEXT_LAYERS)}),
        ZooModel("cosmos3-distilled", "Cosmos3DistilledModularPipeline", "video",
                 "Cosmos 3 distilled layout (modular only): 2 joint text/vision layers, 8 query / 4 KV heads; no text "
                 "encoder (the transformer embeds the token ids); Wan VAE; 4 fixed steps, 1 call per step; 9 frames "
                 "of 64x64 -> 48 vision + 212 text tokens; safety checker off in the folder's config",
                 modular_video.build_cosmos3_distilled,
                 {"prompt": "a small red cube spinning", "height": 64, "width": 64, "num_frames": 9,
                  "num_inference_steps": len(modular_video.COSMOS3_SIGMAS)}),
        # Not from diffusers: the code is the `tinymm` package in the repository's examples/ (ditgate.core.examples).
        ZooModel("tinymm", "TinyMMPipeline", "image",
                 "not in diffusers (examples/tinymm): 4 joint blocks, 4 query / 2 KV heads, 2-D RoPE, text padding "
                 "mask; T5; 64x64 -> 256 image + 48 text tokens",
                 builders.build_tinymm,
                 {"prompt": "a tiny red cube on a table", "height": 64, "width": 64, "num_inference_steps": 8,
                  "guidance_scale": 4.0, "max_sequence_length": 48}),
        ZooModel("tinyst", "TinySTPipeline", "video",
                 "not in diffusers (examples/tinyst): factorized attention, 2 spatial + 2 temporal blocks "
                 "interleaved, a position table built in forward, masked cross-attention; T5; 4 frames of 32x32 -> "
                 "4 x 64 tokens; CFG pair of different prompt lengths",
                 builders.build_tinyst,
                 {"prompt": "a tiny red cube spinning on a table", "negative_prompt": "blurry", "height": 32,
                  "width": 32, "num_frames": 4, "num_inference_steps": 8, "guidance_scale": 4.0,
                  "max_sequence_length": 32}),
        ZooModel("tinyav", "TinyAVPipeline", "video",
                 "not in diffusers (examples/tinyav): 2 fused blocks taking video and audio tokens (audio attends to "
                 "itself, video to both); T5; per-frame VAE and a vocoder; returns frames and audio; 4 frames of "
                 "16x16 -> 64 video + 31 audio tokens",
                 builders.build_tinyav,
                 {"prompt": "a tiny drum on a table", "negative_prompt": "blurry", "height": 16, "width": 16,
                  "num_frames": 4, "audio_frames": 31, "num_inference_steps": 8, "guidance_scale": 4.0,
                  "max_sequence_length": 16}),
        ZooModel("tinymoe", "TinyMoEPipeline", "image",
                 "not in diffusers (examples/tinymoe): 2 blocks with an expert-choice MoE (4 packed experts, a fused "
                 "SwiGLU shared expert), chunked modulation, q_norm/k_norm; T5; 32x32 -> 64 tokens",
                 builders.build_tinymoe,
                 {"prompt": "a tiny red cube on a table", "negative_prompt": "blurry", "height": 32, "width": 32,
                  "num_inference_steps": 8, "guidance_scale": 4.0, "max_sequence_length": 32}),
    ]
}


# The pipeline zoo, under its own prefix: `zoo:pipe/flux-kontext`
PIPELINES: dict[str, ZooModel] = {
    pipelines.PREFIX + s.name: ZooModel(pipelines.PREFIX + s.name, s.pipeline, s.modality, s.summary, s.build, s.call)
    for s in pipelines.SPECS
}


def names() -> list[str]:
    return list(ZOO)


def get(name: str) -> ZooModel:
    if name.startswith(ZOO_PREFIX):
        name = name[len(ZOO_PREFIX):]
    try:
        return ZOO[name] if not name.startswith(pipelines.PREFIX) else PIPELINES[name]
    except KeyError:
        known = ", ".join(PIPELINES) if name.startswith(pipelines.PREFIX) else ", ".join(ZOO) + ", pipe/..."
        raise UnknownZooModelError(f"no zoo model named {name!r}; known: {known}") from None


def _folder_name(model: ZooModel) -> str:
    return model.name.replace("/", "+")  # pipe/NAME -> pipe+NAME


def is_spec(model: str | os.PathLike) -> bool:
    return isinstance(model, str) and model.startswith(ZOO_PREFIX)


def cache_root() -> Path:
    return Path(os.environ.get("DITGATE_HOME", Path.home() / ".cache" / "ditgate")) / "zoo"


def _fingerprint(model: ZooModel, seed: int) -> str:
    import diffusers
    import transformers

    key = f"{ZOO_FORMAT}|{model.name}|{seed}|{diffusers.__version__}|{transformers.__version__}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _stage(model: ZooModel, seed: int, parent: Path) -> Path:
    """Build and save `model` into a fresh hidden folder under `parent`; removed again on any failure."""
    def fill(staging: Path) -> None:
        pipe = model.build(seed)
        if _is_modular(pipe):  # its index then points at the folder the components are saved in
            pipe.save_pretrained(str(staging), safe_serialization=True, overwrite_modular_index=True)
        else:
            pipe.save_pretrained(staging, safe_serialization=True)
        _check_complete(staging)
        meta = {"zoo": model.name, "seed": seed, "modality": model.modality, "call": model.call,
                "vae_tiling": model.vae_tiling, "format": ZOO_FORMAT}
        (staging / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    return publish.staged(parent, _folder_name(model), fill)


def _is_modular(pipe) -> bool:
    from diffusers import ModularPipeline

    return isinstance(pipe, ModularPipeline)


def _check_complete(folder: Path) -> None:
    """Every saved model component holds weights (transformers writes none on a rank other than 0)."""
    empty = [d.name for d in folder.iterdir()
             if d.is_dir() and (d / "config.json").is_file()
             and not any(d.glob("*.safetensors")) and not any(d.glob("*.bin"))]
    if empty:
        raise DitgateError(f"saving wrote no weights for {', '.join(sorted(empty))}: with torch.distributed "
                           "initialised, transformers saves only on rank 0; build zoo models before the process group "
                           "starts (ditgate run does), or on rank 0 only")


def _distributed_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def build(name: str, directory: str | os.PathLike, seed: int = 0, overwrite: bool = False) -> Path:
    """Build zoo model `name` with `seed` into `directory`: the folder is complete, or left as it was."""
    model = get(name)
    target = Path(directory)
    publish.check_target(target, overwrite)
    try:
        staging = _stage(model, seed, target.absolute().parent)
    except OSError as exc:
        raise DitgateError(f"cannot write the model into {target}: {exc.strerror or exc}") from None
    return publish.replace(staging, target)


def materialize(spec: str, seed: int = 0) -> Path:
    """Folder of zoo model `spec` in the cache, built on first use (safe when several processes race)."""
    model = get(spec)
    target = cache_root() / f"{_folder_name(model)}-{_fingerprint(model, seed)}"
    if publish.has_index(target):
        return target
    if _distributed_rank() != 0:  # rank 0 builds; the others wait for its folder
        return publish.wait_for(target, f"rank {_distributed_rank()}")
    return publish.publish_once(_stage(model, seed, target.parent), target)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The zoo metadata (`ditgate.json`) of a model folder, or {} for a folder not built by the zoo."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise DitgateError(f"cannot read {meta_path}: {exc}") from None
    if not isinstance(meta, dict):
        raise DitgateError(f"{meta_path} holds a JSON {type(meta).__name__}, not an object")
    for key in ("call", "vae_tiling"):  # mappings of arguments (README: "The model folder's ditgate.json")
        if key in meta and not isinstance(meta[key], dict):
            raise DitgateError(f"{meta_path}: \"{key}\" must be an object of arguments, got a JSON "
                               f"{type(meta[key]).__name__}")
    return meta
