"""Text encoders of a twin: how deep they must stay, the layer arguments of the call, and stand-in tokenizers.

Depth. A text encoder keeps one block of each kind, and enough layers for every hidden state the pipeline reads:
`hidden_states[-2]` (CLIP in FLUX.1 and SD3, Wan's image encoder) keeps two, `hidden_states[-(skip + 1)]` with
`skip=2` three. A call argument that names encoder layers (`text_encoder_out_layers=(9, 18, 27)` in FLUX.2,
`text_encoder_layer=50`) is rewritten for the twin's encoder, its length kept (the transformer's text width is that
many encoder widths), and the summary says so.

Tokenizers. A tokenizer with its files is copied and its vocabulary kept (TE-P shards it). Without them (a folder
of configs only) a stand-in is built offline (`ditgate.zoo.tokenizers`: character-level CLIP, T5, byte-level Qwen2,
Llama, Gemma, ByT5, BERT; a chat processor for a processor), its paired encoder's vocabulary is cut to match (rounded up to a multiple of 64 so any
rank count up to 64 divides it) and the encoder config's special token ids are moved into it.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditgate.twin.meta import Path_, TwinError, flatten, is_int, read_json

_NEG_READ = re.compile(r"hidden_states\[\s*-\s*(\d+)\s*\]")
_NEG_VAR_READ = re.compile(r"hidden_states\[\s*-\s*\(\s*(\w+)\s*\+\s*(\d+)\s*\)\s*\]")
_MAX_READ = 8  # deeper literal reads are not hidden-state indices of a text encoder
VOCAB_MULTIPLE = 64


@dataclass
class Needs:
    layers: int = 1  # the fewest layers each text encoder keeps
    reasons: list[str] = field(default_factory=list)
    layer_args: dict[str, Any] = field(default_factory=dict)  # call arguments that name encoder layers
    index_args: dict[str, Any] = field(default_factory=dict)  # pipeline settings (model_index.json) that do

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def call_defaults(source) -> dict[str, Any]:
    """The call's arguments with their defaults: `__call__`'s parameters, or a modular pipeline's block inputs."""
    if source.modular:
        from ditgate.core import modular

        pipe = modular.from_pretrained(source.path, source.pipeline, source.trust_remote_code)
        return {p.name: p.default for p in pipe.blocks.inputs if p.name}
    params = inspect.signature(source.pipeline_cls.__call__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def _code(source) -> str:
    """The source code of the pipeline class's modules (its bases within the same library) or of its blocks."""
    import importlib

    names = list(source.blocks_modules) if source.modular else [
        c.__module__ for c in source.pipeline_cls.__mro__ if c.__module__.split(".")[0] not in ("builtins", "torch")]
    texts = []
    for name in dict.fromkeys(names):
        try:
            texts.append(inspect.getsource(importlib.import_module(name)))
        except (OSError, TypeError, ImportError):
            continue
    return "\n".join(texts)


def needs(source, defaults: dict[str, Any]) -> Needs:
    """What the pipeline's code and call read of its text encoders (see the module docstring)."""
    out = Needs()
    code = _code(source)
    deepest = max([int(k) for k in _NEG_READ.findall(code) if 0 < int(k) <= _MAX_READ] or [1])
    for var, offset in _NEG_VAR_READ.findall(code):
        match = re.search(rf"\b{var}\s*(?::[^=\n,)]*)?=\s*(\d+)", code)
        if match and 0 < int(match.group(1)) + int(offset) <= _MAX_READ:
            deepest = max(deepest, int(match.group(1)) + int(offset))
    if deepest > 1:
        out.layers = deepest
        out.reasons.append(f"the pipeline reads hidden_states[-{deepest}]")
    call = {**defaults, **dict(source.meta.get("call") or {})}
    for name, value in call.items():
        if "layer" not in name.lower() or name.startswith("num_"):
            continue
        if isinstance(value, (list, tuple)) and value and all(is_int(v) for v in value):
            out.layer_args[name] = list(value)
            out.layers = max(out.layers, min(2, len(value)))
        elif is_int(value) and value != 0:
            out.layer_args[name] = value
            if value < 0:
                out.layers = max(out.layers, min(-value, _MAX_READ))
    if out.layer_args:
        out.reasons.append(f"the call names encoder layers ({', '.join(out.layer_args)})")
    for name, value in ({} if source.modular else source.index).items():  # Krea2's text_encoder_select_layers
        if "layer" in name.lower() and not name.startswith("_") and isinstance(value, list) and value \
                and all(is_int(v) for v in value):
            out.index_args[name] = list(value)
            out.layers = max(out.layers, min(2, len(value)))
    if out.index_args:
        out.reasons.append(f"the pipeline's settings name encoder layers ({', '.join(out.index_args)})")
    return out


def rewrite_layer_args(layer_args: dict[str, Any], layers: int) -> dict[str, Any]:
    """The layer arguments for a `layers`-deep twin encoder: a list keeps its length, spread over layers 1..L (the
    transformer's text width is the list's length times the encoder's); a positive index becomes the last layer."""
    out = {}
    for name, value in layer_args.items():
        if isinstance(value, list):
            m = len(value)
            new = [1 + (i * layers) // m for i in range(m)] if m > layers else list(range(layers - m + 1, layers + 1))
            out[name] = new
        elif value > layers:
            out[name] = layers
    return {k: v for k, v in out.items() if v != layer_args[k]}


def encoders(source) -> list[str]:
    """Components a hidden-state read or a layer argument is about: transformers models named *encoder*."""
    return [n for n, c in source.components.items()
            if c.kind == "model" and c.library is not None and c.library.name == "transformers" and "encoder" in n]


# ------------------------------------------------------------------------------------------------ tokenizers
def _builders():
    from ditgate.zoo.pipelines import encoders as enc
    from ditgate.zoo.tokenizers import clip_tokenizer, t5_tokenizer

    return [("byt5", lambda n: enc.byt5_tokenizer()), ("clip", clip_tokenizer), ("t5", t5_tokenizer),
            ("bert", lambda n: enc.bert_tokenizer()), ("llama", lambda n: enc.llm_tokenizer("llama")),
            ("gemma", lambda n: enc.llm_tokenizer("gemma")), ("", lambda n: enc.llm_tokenizer("qwen2"))]


def stand_in(component, positions: int | None = None) -> Any:
    """An offline tokenizer of the component's family (the byte-level Qwen2 one for any other BPE family). Its
    length limit: the tokenizer config's `model_max_length`; for CLIP and T5 stand-ins, else `positions` (the paired
    encoder's position table, 77 for CLIP: pipelines pad a prompt to the tokenizer's limit), else 512. A processor
    (FLUX.2's PixtralProcessor) gets a chat processor (`ditgate.zoo.modular_builders.chat_processor`: byte-level
    Qwen2 tokenizer, a text-only chat template, a PIL image processor): pipelines read a processor's text through
    its `apply_chat_template`, and this one loads without torchvision, which Pixtral's own class needs."""
    from transformers import ProcessorMixin

    if component.class_name.endswith("Processor") or (isinstance(component.cls, type)
                                                      and issubclass(component.cls, ProcessorMixin)):
        from ditgate.zoo.modular_builders import chat_processor

        return chat_processor()
    settings = {}
    if component.folder is not None and (component.folder / "tokenizer_config.json").is_file():
        settings = read_json(component.folder / "tokenizer_config.json", f"component {component.name}")
    max_length = settings.get("model_max_length")
    max_length = max_length if is_int(max_length) and 0 < max_length <= 1_000_000 else None
    family = component.class_name.lower()
    for key, make in _builders():
        if key in family:
            tok = make(max_length or positions or 512) if key in ("clip", "t5") else make(None)
            if max_length and key not in ("clip", "t5"):
                tok.model_max_length = max_length
            return tok
    raise AssertionError("the last builder matches every family")


def tokenizer_of(stand: Any) -> Any:
    """The tokenizer of a stand-in (a processor holds one)."""
    return getattr(stand, "tokenizer", stand)


def paired(source, tokenizer: str) -> list[str]:
    """The model components that read `tokenizer`'s ids: `text_encoder_2` for `tokenizer_2`, `prompt_upsampler`
    for `prompt_upsampler_processor`; every model with a vocabulary when none is paired (a transformer that embeds
    the ids itself)."""
    suffix = tokenizer.removeprefix("tokenizer")
    models = [n for n, c in source.components.items() if c.kind == "model"]
    if tokenizer.startswith("tokenizer") and f"text_encoder{suffix}" in models:
        return [f"text_encoder{suffix}"]
    prefixed = [n for n in models if tokenizer.startswith(n + "_")]
    return prefixed or models


def vocab_changes(config: dict[str, Any], tok) -> dict[Path_, Any]:
    """Config changes that fit a model to the stand-in `tok`: every `vocab_size` (rounded up to a multiple of 64),
    every special token id outside it moved to the stand-in's token of that role (or to the top of its range)."""
    tok = tokenizer_of(tok)
    size = -(-len(tok) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    roles = {"pad": tok.pad_token_id, "eos": tok.eos_token_id, "bos": tok.bos_token_id, "unk": tok.unk_token_id,
             "decoder_start": tok.pad_token_id}
    changes: dict[Path_, Any] = {}
    spare = size - 1
    has_vocab = False
    for path, value in flatten(config):
        name = path[-1]
        if name == "vocab_size" and is_int(value):
            changes[path], has_vocab = size, True
    if not has_vocab:
        return {}
    for path, value in flatten(config):
        name = path[-1]
        if not (name.endswith("token_id") or name.endswith("token_ids") or name.endswith("token_index")):
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(is_int(v) for v in ids) or all(v < len(tok) for v in ids):
            continue
        role = next((r for r in roles if name.startswith(r)), None)
        new = []
        for _ in ids:
            target = roles.get(role) if role else None
            if target is None:
                target, spare = spare, spare - 1
            new.append(target)
        changes[path] = new if isinstance(value, list) else new[0]
    return changes


def save_stand_in(tok, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
