"""Twins: a small float32 copy of any pipeline, built from its configs alone, on which integration faults that hide
under the bf16 noise floor of the real model fail by orders of magnitude.

`build(source, out)` reads the source folder's configs (weights may be absent; `ditgate.twin.source`), keeps every
width (heads, KV heads, head dim, joint and caption widths, patch sizes, latent channels: every divisibility and
TP/CP layout of the real model), cuts each block list to one block of each kind (`ditgate.twin.cut`), text
encoders to the layers the pipeline reads (`ditgate.twin.text`), rebuilds every model with seeded float32 weights
(`ditgate.twin.weights`), copies schedulers and tokenizers, and writes a `ditgate.json` whose call lets every feature
of a run act, checked on the built twin (`ditgate.twin.call`). `cached(source)` builds once per configuration under
`$DITGATE_HOME/twins/`. Both return a `Twin` (`ditgate.twin.summary`).

May import: `ditgate.core` and `ditgate.zoo` only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ditgate.core import logs
from ditgate.twin.assemble import FORMAT
from ditgate.twin.summary import Twin

__all__ = ["FORMAT", "Twin", "build", "cache_root", "cached", "key"]


def _log(quiet: bool):
    def log(message: str) -> None:
        if not quiet:
            logs.progress(f"twin: {message}")
    return log


def build(source: str | os.PathLike, out: str | os.PathLike, *, pipeline: str | None = None,
          trust_remote_code: bool = False, seed: int = 0, call: dict[str, Any] | None = None,
          frames: int | None = None, overwrite: bool = False, quiet: bool = False) -> Twin:
    """Build the twin of `source` (a folder or zoo:NAME) into `out`: complete, or nothing written. `call` fixes
    call arguments of the twin (height, width, steps, prompt, ...) and `frames` its frame count; the rest is
    chosen. `overwrite` replaces a folder that holds a model."""
    from ditgate.twin import assemble, source as source_mod
    from ditgate.zoo import publish

    target = Path(out)
    publish.check_target(target, overwrite)
    src = source_mod.read(source, pipeline=pipeline, trust_remote_code=trust_remote_code)
    final = target.absolute()
    made: dict[str, Twin] = {}

    def fill(staging: Path) -> None:
        made["twin"] = assemble.assemble(src, staging, final, seed=seed, log=_log(quiet), call=call, frames=frames)

    publish.replace(publish.staged(final.parent, final.name, fill), final)
    return made["twin"]


def cache_root() -> Path:
    return Path(os.environ.get("DITGATE_HOME", Path.home() / ".cache" / "ditgate")) / "twins"


def key(source: str | os.PathLike, *, pipeline: str | None = None, trust_remote_code: bool = False, seed: int = 0,
        call: dict[str, Any] | None = None, frames: int | None = None) -> str:
    """The cache key of a twin: the content of every config file of the source (weights left out), the options,
    the twin format and the library versions."""
    import diffusers
    import transformers

    from ditgate.core.loader import resolve
    from ditgate.twin.source import config_files

    path = resolve(source)
    options = json.dumps([FORMAT, pipeline, trust_remote_code, seed, call or {}, frames, diffusers.__version__,
                          transformers.__version__], sort_keys=True, default=str)
    digest = hashlib.sha256(options.encode())
    for file in config_files(path):
        digest.update(str(file.relative_to(path)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cached(source: str | os.PathLike, *, pipeline: str | None = None, trust_remote_code: bool = False,
           seed: int = 0, call: dict[str, Any] | None = None, frames: int | None = None,
           quiet: bool = False) -> Twin:
    """The twin of `source` from `$DITGATE_HOME/twins/<key>`, built there once per configuration (built in a
    hidden folder and renamed; when several processes race, the first rename wins and the others reuse it)."""
    from ditgate.twin import assemble, source as source_mod
    from ditgate.zoo import publish

    target = cache_root() / key(source, pipeline=pipeline, trust_remote_code=trust_remote_code, seed=seed,
                                call=call, frames=frames)
    if not publish.has_index(target):
        src = source_mod.read(source, pipeline=pipeline, trust_remote_code=trust_remote_code)

        def fill(staging: Path) -> None:
            assemble.assemble(src, staging, target, seed=seed, log=_log(quiet), call=call, frames=frames)

        publish.publish_once(publish.staged(target.parent, target.name, fill), target)
    meta = json.loads((target / "ditgate.json").read_text())
    return Twin.from_dict(meta["twin"], target)
