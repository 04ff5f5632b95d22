"""What inspect finds, as dataclasses: components, block lists, attention groups, the sequence, the anatomy."""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any


# the roles of a block's inputs and outputs
H, E, OTHER = "hidden_states", "encoder_hidden_states", "other"
RANKS = (2, 4, 8)
SKIP_FINDING = "(a skip inside the loop)"  # marks a loop finding of a block handed an earlier block's output



KERNEL_PACKAGES = ("flash_attn", "flash_attn_interface", "triton", "apex", "xformers", "transformer_engine",
                   "liger_kernel", "sageattention", "spas_sage_attn", "nunchaku", "bitsandbytes", "deepspeed",
                   "flashinfer", "sgl_kernel", "vllm", "kernels")


# -- result types -------------------------------------------------------------------------------------------------
@dataclass
class Component:
    name: str
    cls: str
    module: str
    source_file: str | None
    parameters: int | None = None


@dataclass
class Param:
    name: str
    kind: str
    has_default: bool


@dataclass
class BlockList:
    transformer: str
    attribute: str
    length: int
    block_class: str
    block_module: str
    source_file: str | None
    signature: list[Param]
    returns: str
    called: bool = False
    call: dict[str, Any] | None = None
    outputs: list[str] | None = None
    output_shapes: list[str] = field(default_factory=list)
    role_evidence: str | None = None
    encoder_param: str | None = None
    pattern: str | None = None
    pattern_reason: str = ""
    check_forward_pattern: bool | None = None
    patch_functor_needed: bool = False
    loop_findings: list[str] = field(default_factory=list)
    per_block_arguments: list[str] = field(default_factory=list)  # arguments the loop gives each block its own of
    stream_changed_between: bool = False  # the loop changes the hidden stream between two block calls
    # the stream inputs cache-dit's cached list passes first by position, which the block takes elsewhere and the
    # loop passes by name (BlockLoop's `calls` passes them on by name)
    call_form: list[str] = field(default_factory=list)
    chained: bool = True  # some block was handed the previous block's output or a part of it (False: no loop)
    # a skip inside the loop: argument -> {receiving block: [the earlier block whose output it is, output position]}
    skip_sources: dict[str, dict[int, list[int]]] = field(default_factory=dict)


@dataclass
class AttentionGroup:
    transformer: str
    group: str
    cls: str
    processor: str | None
    calls: int
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    kernel_heads: int | None = None
    kernel_kv_heads: int | None = None
    kernel_head_dim: int | None = None
    q_len: int | None = None
    kv_len: int | None = None
    kind: str | None = None
    mask: bool = False
    enable_gqa: bool = False


@dataclass
class Attention:
    heads: int | None = None
    kv_heads: int | None = None
    kernel_kv_heads: int | None = None  # key/value heads reaching the kernel (after a processor's expansion)
    head_dim: int | None = None
    gqa: bool = False
    mask: bool = False
    mask_sources: list[str] = field(default_factory=list)
    mask_all_true: bool | None = None
    fused_qkv: list[str] = field(default_factory=list)
    non_pytorch_kernels: list[str] = field(default_factory=list)
    attention_backends: list[str] = field(default_factory=list)
    qk_norm_across_heads: list[str] = field(default_factory=list)
    groups: list[AttentionGroup] = field(default_factory=list)


@dataclass
class Sequence:
    image_tokens: int | None = None
    text_tokens: int | None = None
    attention_tokens: int | None = None
    joint: bool = False
    per_token_tables: list[str] = field(default_factory=list)
    gather_candidates: list[str] = field(default_factory=list)
    hidden_made_by: str | None = None  # the module whose output is the first block's hidden states (the embedder)
    block_list: str | None = None  # the block list the sequence was read from
    refiners: list[str] = field(default_factory=list)  # single-stream lists run before it on a shorter part of it
    packed: dict[str, int] = field(default_factory=dict)  # batch-less [tokens, features] streams: input -> tokens
    divisibility: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Traits:
    """What the blocks were seen doing (`ditgate.inspect.traits`): each item decides part of a CP or TP plan."""

    masks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # group -> calls of the first step
    mask_lines: list[str] = field(default_factory=list)
    weak_mask: bool | None = None  # every mask nearly all True: mask faults would not show
    per_block_tensors: list[dict[str, Any]] = field(default_factory=list)
    part_counts: list[dict[str, Any]] = field(default_factory=list)  # integers counting one end of a block's stream
    grid_blocks: list[dict[str, Any]] = field(default_factory=list)  # blocks that fold their stream into the grid
    interleaved: list[list[str]] = field(default_factory=list)  # [list a, list b] whose blocks alternate
    list_layouts: dict[str, str] = field(default_factory=dict)  # block list -> what its block 0 returned
    chunked_modulation: list[str] = field(default_factory=list)
    gated_mlps: list[str] = field(default_factory=list)
    reads_block_input: list[str] = field(default_factory=list)  # Linears whose input is no Linear of the block
    packed_parameters: list[dict[str, Any]] = field(default_factory=list)
    sequence_routing: list[str] = field(default_factory=list)  # sorts / top-k over the sequence inside a block
    attention_norms: dict[str, str] = field(default_factory=dict)  # norm inside attention -> per head / across heads
    repeated_modules: dict[str, int] = field(default_factory=dict)  # module outside the blocks -> calls per forward
    output_types: dict[str, str] = field(default_factory=dict)  # transformer -> class of what it returned
    long_skips: list[str] = field(default_factory=list)  # the first block's input added back after the blocks
    outside_calls: list[str] = field(default_factory=list)  # block sub-modules run outside their block
    calls_per_step: dict[str, float | None] = field(default_factory=dict)  # transformer -> calls per step
    steps_by_transformer: dict[str, list[int]] = field(default_factory=dict)  # transformer -> the steps it served
    block_variants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # list -> its block structures
    experts: list[dict[str, Any]] = field(default_factory=list)  # expert layers: router, shared, routing kind
    linear_chains: list[list[str]] = field(default_factory=list)  # [a Linear, a Linear of its block reading it]


@dataclass
class Anatomy:
    model: str
    pipeline: Component
    call: dict[str, Any]
    steps: int
    components: dict[str, list[Component]]
    block_lists: list[BlockList]
    between_lists: list[str]
    calls_per_step: float | None
    calls_by_step: list[int]
    transformer_calls: dict[str, int]
    has_separate_cfg: bool
    batch: int | None
    attention: Attention
    sequence: Sequence
    tp_layers: dict[str, list[dict[str, Any]]]
    cache_dit: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    plan: str = ""
    traits: Traits = field(default_factory=Traits)
    modular: dict[str, Any] | None = None  # a ModularPipeline: block tree, denoise loop, guider, output name
    request_args: list[str] = field(default_factory=list)  # the options that make the inspected call again
    sizes: dict[str, Any] = field(default_factory=dict)  # where CP and VAE-P act (ditgate.inspect.plan.call.Sizes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_AUDIO_NAMES = ("Audio", "Music", "Speech", "Sound", "TTS")
_VIDEO_NAMES = ("Video", "I2V", "T2V", "Mochi", "Allegro", "Latte", "Animate", "SkyReels", "Cosmos", "LTX")


def latent_words(anatomy: "Anatomy") -> str:
    """What the tokens of the latent sequence are, in the words of the pipeline's modality: "image tokens",
    "video tokens" (a frame argument, or a video pipeline's name) or "audio tokens"."""
    from ditgate.core.request import FRAME_NAMES

    name = anatomy.pipeline.cls or ""
    if any(word in name for word in _AUDIO_NAMES):
        return "audio tokens"
    if any(k in anatomy.call for k in FRAME_NAMES) or any(word in name for word in _VIDEO_NAMES):
        return "video tokens"
    return "image tokens"


def serves(anatomy: "Anatomy", transformer: str) -> str:
    """Which calls of the pipeline a transformer served: "transformer_2: 8 calls, steps 4-7, 2 per step (cond and
    uncond)"."""
    from ditgate.core.steps import step_ranges

    calls = anatomy.transformer_calls.get(transformer, 0)
    steps = anatomy.traits.steps_by_transformer.get(transformer) or []
    per = anatomy.traits.calls_per_step.get(transformer)
    said = [f"{calls} call{'s' * (calls != 1)}"] + ([step_ranges(steps)] if steps else [])
    if per:
        said.append(f"{per:g} per step" + (" (cond and uncond)" if per == 2 else ""))
    return f"{transformer}: {', '.join(said)}"


def call_size(call: dict[str, Any]) -> str:
    """"HxW", "F frames of HxW", "2 s of audio" or "" for the call's arguments."""
    from ditgate.core.request import FRAME_NAMES

    size = "x".join(str(call[k]) for k in ("height", "width") if call.get(k) is not None)
    frames = next((call[k] for k in FRAME_NAMES if call.get(k) is not None), None)
    if frames is not None:
        return f"{frames} frames" + (f" of {size}" if size else "")
    seconds = next((call[k] for k in ("audio_end_in_s", "audio_length_in_s", "audio_duration_s", "duration")
                    if call.get(k) is not None), None)
    return size or (f"{seconds} s of audio" if seconds is not None else "")


def source_file(obj: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj if inspect.isclass(obj) else type(obj))
    except (TypeError, OSError):
        return None
