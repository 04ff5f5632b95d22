"""The source of a twin, from its configs alone: the pipeline class and each component's class, kind and folder.

The pipeline class and the remote-code rule are the loader's (`ditgate.core.loader.call_class`: `--pipeline
module:Class`, `model_index.json`'s `_class_name`, code from the model folder only with `--trust-remote-code`); a
modular folder is read by `ditgate.core.modular.from_pretrained`, which resolves its blocks and component specs
without weights. A component is a model (a diffusers `ModelMixin` or a transformers `PreTrainedModel`: rebuilt from
its config), a tokenizer or processor (its files are copied, or a stand-in is built when it has none), or anything
else with a folder of configs (scheduler, feature extractor: copied as it is).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditgate import zoo
from ditgate.core import loader, modular
from ditgate.core.examples import ensure_packages
from ditgate.twin.meta import DIFFUSERS, TRANSFORMERS, Library, TwinError, read_json

_TOKENIZER_CLASSES = ("Processor", "Tokenizer", "TokenizerFast")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".onnx", ".h5")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "merges.txt", "spm.model", "vocab.model", "sentencepiece.model")


@dataclass
class Component:
    name: str
    entry: Any  # the index entry ([library, class] or the modular triple)
    cls: type | None = None
    kind: str = "none"  # "model" | "tokenizer" | "config" | "none"
    library: Library | None = None
    folder: Path | None = None  # its folder in the source (None when the index names no files for it)
    missing: tuple[str, ...] = ()  # libraries its class needs that are not installed (a transformers placeholder)

    @property
    def class_name(self) -> str:
        if self.missing and isinstance(self.entry, list) and len(self.entry) >= 2:
            return str(self.entry[1])  # a placeholder class is named "Placeholder"
        return self.cls.__name__ if self.cls is not None else "None"

    @property
    def has_tokenizer_files(self) -> bool:
        return self.folder is not None and any((self.folder / f).is_file() for f in TOKENIZER_FILES)


@dataclass
class Source:
    path: Path
    modular: bool
    index_name: str  # model_index.json or modular_model_index.json
    index: dict[str, Any]
    pipeline_cls: type
    pipeline: str | None  # the --pipeline given
    trust_remote_code: bool
    components: dict[str, Component] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # the source's ditgate.json
    blocks_modules: list[str] = field(default_factory=list)  # modules of a modular pipeline's blocks

    @property
    def spec(self) -> str:
        return str(self.path)


def read(model: str | Path, *, pipeline: str | None = None, trust_remote_code: bool = False) -> Source:
    """The source at `model` (a folder or zoo:NAME), checked and resolved without reading a weight."""
    path = loader.resolve(model)
    meta = zoo.read_meta(path)
    if modular.wants_modular(path, pipeline):
        return _read_modular(path, pipeline, trust_remote_code, meta)
    index = loader.read_index(path)
    cls = loader.call_class(path, pipeline, trust_remote_code)
    source = Source(path, False, "model_index.json", index, cls, pipeline, trust_remote_code, meta=meta)
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, (list, tuple)):
            continue
        if not all(v is None or isinstance(v, str) for v in entry):
            continue  # a pipeline setting that is a list (Krea2's text_encoder_select_layers [0, 1, 2]): kept as is
        if len(entry) != 2:
            raise TwinError(f"{path / 'model_index.json'}: component {name} is {entry!r}, not a [library, class] pair")
        source.components[name] = _component(path, name, entry, entry[0], entry[1], trust_remote_code)
    _check_configs(source)
    _check_vocabularies(source)
    return source


def _check_vocabularies(source: Source) -> None:
    """A tokenizer shipped with its files and the encoder that reads its ids must agree: a config whose vocab_size
    is below the tokenizer's length (a config that lies) would fail the twin's first call with an IndexError deep
    in an embedding, after every component was built. Refused first, naming both."""
    from ditgate.twin.text import paired

    for name, component in source.components.items():
        if component.kind != "tokenizer" or not component.has_tokenizer_files or component.cls is None:
            continue
        encoders = {n: read_json(source.components[n].folder / "config.json", f"component {n}")
                    for n in paired(source, name) if source.components[n].folder is not None
                    and (source.components[n].folder / "config.json").is_file()}
        sizes = {n: c.get("vocab_size", (c.get("text_config") or {}).get("vocab_size")) for n, c in encoders.items()}
        sizes = {n: v for n, v in sizes.items() if isinstance(v, int) and not isinstance(v, bool)}
        if not sizes:
            continue
        try:
            tokenizer = component.cls.from_pretrained(component.folder)
            length = len(getattr(tokenizer, "tokenizer", tokenizer))  # a processor holds its tokenizer
        except Exception:  # noqa: BLE001 - files this check cannot read: the twin copies them and its call judges
            continue
        for encoder, size in sizes.items():
            if size < length:
                raise TwinError(f"component {encoder}: its config's vocab_size is {size:,}, but {name} has {length:,} "
                                f"tokens, so ids from {size:,} up would index past its embedding table; the config "
                                "does not match the tokenizer: fix vocab_size (or the tokenizer files)")


def _check_links(source: Source) -> None:
    """The twin copies the source's files (configs, tokenizers, schedulers, code): a symbolic link out of the model
    folder would have it copy whatever the link points at (`scheduler/scheduler_config.json -> ~/.ssh/id_rsa`) into
    a folder meant to be shared. Refused, except links into the hub cache's own blobs (a snapshot's files are links
    to `models--ORG--NAME/blobs/`)."""
    root = source.path.resolve()
    allowed = [root]
    if source.path.parent.name == "snapshots" and (source.path.parent.parent / "blobs").is_dir():
        allowed.append(source.path.parent.parent.resolve())
    folders = [c.folder for c in source.components.values() if c.folder is not None]
    paths = [*source.path.iterdir(), *(p for folder in folders for p in [folder, *folder.rglob("*")])]
    for path in paths:
        if path.is_symlink() and not any(path.resolve().is_relative_to(a) for a in allowed):
            raise TwinError(f"{path} is a symbolic link out of the model folder (to {os.readlink(path)}); a twin "
                            "copies the folder's files and would copy what it points at: replace the link with the "
                            "file")


def _check_configs(source: Source) -> None:
    """Read every JSON file of the components' folders before anything is built: a broken config is refused
    before the first component costs time."""
    _check_links(source)
    for name, component in source.components.items():
        if component.folder is not None and component.kind in ("model", "config"):
            for file in sorted(component.folder.glob("*.json")):
                if not file.name.endswith(".index.json"):
                    read_json(file, f"component {name}")


def _read_modular(path: Path, pipeline: str | None, trust_remote_code: bool, meta: dict[str, Any]) -> Source:
    pipe = modular.from_pretrained(path, pipeline, trust_remote_code)
    index = modular.read_index(path) if modular.is_modular_folder(path) else loader.read_index(path)
    source = Source(path, True, modular.MODULAR_INDEX if modular.is_modular_folder(path) else "model_index.json",
                    index, type(pipe), pipeline, trust_remote_code, meta=meta)
    source.blocks_modules = sorted({type(b).__module__ for b in _walk_blocks(pipe.blocks)})
    for name, spec in pipe._component_specs.items():
        entry = index.get(name)
        if spec.default_creation_method != "from_pretrained" or not isinstance(entry, (list, tuple)):
            continue  # made by the blocks from a config (guider, scheduler without files): nothing to copy
        folder = path / (spec.subfolder or name)
        component = Component(name, entry, cls=spec.type_hint, folder=folder if folder.is_dir() else None)
        _classify(component)
        source.components[name] = component
    _check_configs(source)
    return source


def _walk_blocks(blocks):
    yield blocks
    for child in (getattr(blocks, "sub_blocks", None) or {}).values():
        yield from _walk_blocks(child)


def _component(path: Path, name: str, entry, library, class_name, trust_remote_code: bool) -> Component:
    component = Component(name, list(entry))
    if library is None or class_name is None:
        return component
    folder = path / name
    component.folder = folder if folder.is_dir() else None
    component.cls = _class(path, name, str(library), str(class_name), trust_remote_code)
    _classify(component)
    if component.kind in ("model", "config") and component.folder is None:
        raise TwinError(f"component {name} ({class_name}) has no folder in {path}: a twin needs its config")
    return component


def _class(path: Path, name: str, library: str, class_name: str, trust_remote_code: bool):
    """The class of a component: from diffusers, transformers, an importable package, or (trusted) the folder."""
    import diffusers.pipelines

    if library in ("diffusers", "transformers"):
        module = importlib.import_module(library)
    elif hasattr(diffusers.pipelines, library):  # a diffusers pipeline module ("stable_audio"), as diffusers reads it
        module = getattr(diffusers.pipelines, library)
    else:
        ensure_packages({name: [library, class_name]})
        module = None
        for candidate in (path / name / f"{library}.py", path / f"{library}.py"):
            if candidate.is_file() and loader.not_installed(library):
                if not trust_remote_code:
                    raise TwinError(f"component {name} names {class_name} from {candidate}, code inside the model "
                                    "folder; read it, then pass --trust-remote-code")
                return loader._import_file_class(candidate, class_name)
        try:
            loader.check_module_name(library, class_name, f"component {name}")
            module = importlib.import_module(library)
        except ImportError as exc:
            raise TwinError(f"component {name}: cannot import {library!r} for {class_name} ({exc})") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise TwinError(f"component {name}: {library} has no class {class_name!r}")
    return cls


def _classify(component: Component) -> None:
    from diffusers import ModelMixin
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin

    cls = component.cls
    if not isinstance(cls, type):
        component.kind = "none" if cls is None else "config"
        return
    if type(cls).__name__ == "DummyObject":  # transformers' placeholder for a class whose library is not installed
        component.missing = tuple(getattr(cls, "_backends", ()) or ("a library",))
        if component.class_name.endswith(_TOKENIZER_CLASSES):
            component.kind = "tokenizer"  # a stand-in can take its place when it has no files
            return
    if issubclass(cls, ModelMixin):
        component.kind, component.library = "model", DIFFUSERS
    elif issubclass(cls, PreTrainedModel):
        component.kind, component.library = "model", TRANSFORMERS
    elif issubclass(cls, (PreTrainedTokenizerBase, ProcessorMixin)):
        component.kind = "tokenizer"
    else:
        component.kind = "config"


def config_files(path: Path) -> list[Path]:
    """Every file of the source folder a twin is built from (weights and hidden files left out): what the cache
    key hashes."""
    files = []
    for file in sorted(path.rglob("*")):
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES) and ".safetensors.index" not in file.name \
                and ".bin.index" not in file.name and "/." not in f"/{file.relative_to(path)}":
            files.append(file)
    return files
