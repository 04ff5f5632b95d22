"""The model families the FLOP counter knows: the geometry of one forward at a size (tokens, latent shape), its meta inputs, and where a model's configs are read from."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from ditgate.core.errors import DitgateError


class FlopsError(DitgateError):
    """The FLOPs of this model cannot be counted (unknown family, missing config, bad size)."""


@dataclass(frozen=True)
class Geometry:
    """Token counts of one transformer call at a size."""

    image_tokens: int
    text_tokens: int
    latent_shape: tuple[int, ...]  # the transformer's `hidden_states` shape (batch 1)

    @property
    def tokens(self) -> int:
        return self.image_tokens + self.text_tokens


@dataclass(frozen=True)
class Family:
    name: str
    prefix: str  # transformer class-name prefix
    geometry: Callable[[dict, dict, int, int, int | None, int], Geometry]
    inputs: Callable[[dict, Geometry, Any], dict]
    text_len: int  # default text tokens when the request does not fix them
    calls_per_step: int  # default transformer calls per denoising step (separate CFG: 2)
    tp_sharded: tuple[str, ...]  # Linear names (suffixes) whose weights TP shards
    tp_rowwise: tuple[str, ...]  # ... of which RowwiseParallel: their output is all-reduced
    tp_gathered: tuple[str, ...]  # ... of which ColwiseParallel(output_layouts=Replicate()): output all-gathered
    cache_merges_lists: bool  # cache-dit caches all block lists as one sequence (Flux's dummy-block adapter)
    video: bool = False


def _meta(shape, dtype):
    import torch

    return torch.empty(*shape, device="meta", dtype=dtype)


def _packed_2x2(scale: int, height: int, width: int) -> tuple[int, int]:
    """Latent height/width after the Flux / Qwen-Image pipelines round the size, then 2x2 packing."""
    lh, lw = 2 * (height // (scale * 2)), 2 * (width // (scale * 2))
    if lh == 0 or lw == 0:
        raise FlopsError(f"{height}x{width} is smaller than one latent patch (VAE scale {scale} x 2)")
    return lh // 2, lw // 2


def _flux_geometry(cfg, vae, height, width, frames, text_len) -> Geometry:
    scale = 2 ** (len(vae["block_out_channels"]) - 1) if vae.get("block_out_channels") else 8
    h, w = _packed_2x2(scale, height, width)
    return Geometry(h * w, text_len, (1, h * w, cfg.get("in_channels", 64)))


def _flux_inputs(cfg, geo: Geometry, dtype) -> dict:
    s, t = geo.image_tokens, geo.text_tokens
    kw = {"hidden_states": _meta(geo.latent_shape, dtype),
          "encoder_hidden_states": _meta((1, t, cfg.get("joint_attention_dim", 4096)), dtype),
          "pooled_projections": _meta((1, cfg.get("pooled_projection_dim", 768)), dtype),
          "timestep": _meta((1,), dtype), "img_ids": _meta((s, 3), dtype), "txt_ids": _meta((t, 3), dtype)}
    if cfg.get("guidance_embeds"):
        kw["guidance"] = _meta((1,), dtype)
    return kw


def _wan_geometry(cfg, vae, height, width, frames, text_len) -> Geometry:
    if frames is None:
        raise FlopsError("a video model needs --frames")
    downsample = vae.get("temperal_downsample")
    spatial = vae.get("scale_factor_spatial") or (2 ** len(downsample) if downsample else 8)
    temporal = vae.get("scale_factor_temporal") or (2 ** sum(map(bool, downsample)) if downsample else 4)
    lf, lh, lw = (frames - 1) // temporal + 1, height // spatial, width // spatial
    pt, ph, pw = cfg.get("patch_size", (1, 2, 2))
    if lf % pt or lh % ph or lw % pw or lh == 0 or lw == 0:
        raise FlopsError(f"{frames} frames of {height}x{width} give latents {lf}x{lh}x{lw}, which patches "
                         f"{pt}x{ph}x{pw} do not divide")
    table = cfg.get("rope_max_seq_len")  # positions WanRotaryPosEmbed holds per axis
    for axis, count in (("frames", lf // pt), ("height", lh // ph), ("width", lw // pw)):
        if isinstance(table, int) and count > table:
            raise FlopsError(f"{frames} frames of {height}x{width} give {count} positions along the {axis}, more "
                             f"than the transformer's rotary table holds (rope_max_seq_len {table}): choose a "
                             "smaller size")
    return Geometry((lf // pt) * (lh // ph) * (lw // pw), text_len, (1, cfg.get("in_channels", 16), lf, lh, lw))


def _wan_inputs(cfg, geo: Geometry, dtype) -> dict:
    return {"hidden_states": _meta(geo.latent_shape, dtype), "timestep": _meta((1,), dtype),
            "encoder_hidden_states": _meta((1, geo.text_tokens, cfg.get("text_dim", 4096)), dtype)}


def _qwen_geometry(cfg, vae, height, width, frames, text_len) -> Geometry:
    downsample = vae.get("temperal_downsample")
    scale = 2 ** len(downsample) if downsample else 8
    h, w = _packed_2x2(scale, height, width)
    return Geometry(h * w, text_len, (1, h * w, cfg.get("in_channels", 64)))


def _qwen_inputs(cfg, geo: Geometry, dtype) -> dict:
    h_w = geo.image_tokens
    # img_shapes only feeds RoPE, whose tables are sized by the product; any factorisation counts the same
    side = int(math.isqrt(h_w))
    shape = (1, side, h_w // side) if side * (h_w // side) == h_w else (1, 1, h_w)
    kw = {"hidden_states": _meta(geo.latent_shape, dtype),
          "encoder_hidden_states": _meta((1, geo.text_tokens, cfg.get("joint_attention_dim", 3584)), dtype),
          "timestep": _meta((1,), dtype), "img_shapes": [[shape]]}
    if cfg.get("guidance_embeds"):
        kw["guidance"] = _meta((1,), dtype)
    return kw


FAMILIES: tuple[Family, ...] = (
    Family("flux", "FluxTransformer2DModel", _flux_geometry, _flux_inputs, text_len=512, calls_per_step=1,
           tp_sharded=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2",
                       "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
                       "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear",
                       "proj_mlp", "proj_out", "norm.linear"),
           tp_rowwise=("attn.to_out.0", "ff.net.2", "attn.to_add_out", "ff_context.net.2", "proj_out"),
           tp_gathered=("norm1.linear", "norm1_context.linear", "norm.linear"),
           cache_merges_lists=True),
    Family("wan", "WanTransformer3DModel", _wan_geometry, _wan_inputs, text_len=512, calls_per_step=2,
           tp_sharded=("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                       "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"),
           tp_rowwise=("attn1.to_out.0", "attn2.to_out.0", "ffn.net.2"), tp_gathered=(),
           cache_merges_lists=False, video=True),
    Family("qwen-image", "QwenImageTransformer2DModel", _qwen_geometry, _qwen_inputs, text_len=128,
           calls_per_step=1,
           tp_sharded=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "img_mod.1", "img_mlp.net.0.proj",
                       "img_mlp.net.2", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
                       "txt_mod.1", "txt_mlp.net.0.proj", "txt_mlp.net.2"),
           tp_rowwise=("attn.to_out.0", "img_mlp.net.2", "attn.to_add_out", "txt_mlp.net.2"),
           tp_gathered=("img_mod.1", "txt_mod.1"),
           cache_merges_lists=False),
)


def family_of(class_name: str) -> Family:
    for family in FAMILIES:
        if class_name.startswith(family.prefix):
            return family
    known = ", ".join(f.prefix for f in FAMILIES)
    raise FlopsError(f"no FLOP model for transformer class {class_name!r}; ditgate counts {known}")


@dataclass(frozen=True)
class Source:
    """The configs a count needs: the transformer's, the VAE's (may be empty) and request defaults."""

    transformer: dict
    vae: dict
    defaults: dict  # the zoo's call arguments, when the model is a zoo model
    where: str

    @property
    def class_name(self) -> str:
        return str(self.transformer.get("_class_name", ""))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FlopsError(f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise FlopsError(f"{path} is not valid JSON: {exc}") from None


def source(model: str | Path) -> Source:
    """Configs of `model`: zoo:NAME, a pipeline folder, a transformer folder, or a transformer config.json."""
    from ditgate import zoo

    if zoo.is_spec(str(model)):
        path = zoo.materialize(str(model))
    else:
        path = Path(model).expanduser()
        if not path.exists():
            raise FlopsError(f"{path} does not exist: give zoo:NAME, a pipeline folder, a transformer folder or a "
                             "transformer config.json")
    if path.is_file():
        return Source(_read_json(path), {}, {}, str(path))
    if (path / "model_index.json").is_file() or (path / "modular_model_index.json").is_file():
        vae_file = path / "vae" / "config.json"
        return Source(_read_json(path / "transformer" / "config.json"),
                      _read_json(vae_file) if vae_file.is_file() else {},
                      zoo.read_meta(path).get("call", {}), str(path))
    if (path / "config.json").is_file():
        return Source(_read_json(path / "config.json"), {}, {}, str(path))
    raise FlopsError(f"{path} holds neither model_index.json (nor modular_model_index.json) nor config.json")
