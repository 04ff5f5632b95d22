"""Assemble a twin folder from a source: each component cut, rebuilt or copied, the index, the call, the record.

Models are rebuilt from their (cut) configs with seeded float32 weights, one at a time (each is saved and freed
before the next is built); tokenizers with files, schedulers and other config folders are copied; a tokenizer
without files gets a stand-in (`ditgate.twin.text`). The VAE is kept whole but for its resnets per level
(`weights.VAE_KNOBS`), which cut no width, no down-sampling factor and no tile.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from ditgate.twin import call as call_mod
from ditgate.twin import cut as cut_mod
from ditgate.twin import text, weights
from ditgate.twin.meta import TRANSFORMERS, TwinError, count, is_int, on_meta, one_line, read_json, with_values
from ditgate.twin.source import WEIGHT_SUFFIXES, Component, Source
from ditgate.twin.summary import Twin

FORMAT = 4  # bump when what a twin holds changes: cached twins are then built again
DEEPER_TRIES = 3  # cuts tried when the twin's call fails at every size: the fewest blocks, then one and two more
MAX_TWIN_PARAMS = 20 * 10**9  # 80 GB of float32: more than a twin of any released model holds


def assemble(source: Source, staging: Path, final: Path, *, seed: int, log: Callable[[str], None],
             call: dict[str, Any] | None = None, frames: int | None = None) -> Twin:
    """Fill `staging` with the twin of `source` (its index naming `final`, where it will be renamed to); `call`
    and `frames` are call arguments the user fixed (the rest is chosen)."""
    start = time.monotonic()
    defaults = text.call_defaults(source)
    needs = text.needs(source, defaults)
    encoders = text.encoders(source)
    stand_ins, rewrites, vocab = _tokenizers(source, staging, log)
    given = dict(call or {})
    for deeper in range(DEEPER_TRIES):
        summaries, depths = _components(source, staging, seed, needs, encoders, stand_ins, vocab, log, deeper)
        notes, settings, base = _index_and_call(source, staging, rewrites, needs, depths, given, defaults)
        try:
            choice = call_mod.choose(staging, base, pipeline=source.pipeline,
                                     trust_remote_code=source.trust_remote_code, log=log, given=frozenset(given),
                                     frames=frames,
                                     source_length=(source.meta.get("call") or {}).get("max_sequence_length"))
            break
        except TwinError as exc:  # a forward that pairs its blocks by count (skips) fails on an odd cut: deeper
            cut = any(s.get("action") == "cut" for s in summaries if s["name"].startswith("transformer"))
            if not cut or deeper + 1 == DEEPER_TRIES or "fails at every size" not in str(exc):
                raise
            log(f"the call fails on this cut ({one_line(exc)}): the denoiser's block lists kept one block deeper")
    if deeper:
        notes.append(f"the denoiser's block lists keep {deeper} block{'s' * (deeper > 1)} more than the fewest that "
                     "keep every kind: the call failed on the fewest (a forward that pairs its blocks by count)")
    for key, value in choice.vae_config.items():
        vae = next((s for s in summaries if s["name"] == "vae"), None)
        if vae is not None and _source_value(source, "vae", key) != value:
            vae.setdefault("changes", {})[key] = [_source_value(source, "vae", key), value]
            vae.setdefault("notes", []).append(f"{key} is the tile size of its tiled decode: set so the call's size "
                                               "decodes in tiles")
    twin = Twin(folder=final, source=source.spec, pipeline_class=source.pipeline_cls.__name__, components=summaries,
                params=sum(s.get("params", 0) for s in summaries), bytes=_bytes(staging), call=choice.call,
                vae_tiling=choice.vae_tiling, modality=choice.modality,
                checks={"tokens": choice.tokens, "tiles": choice.tiles, "calls": choice.calls,
                        "output_change": choice.output_change},
                notes=notes + choice.notes, pipeline=source.pipeline, trust_remote_code=source.trust_remote_code,
                seed=seed, build_s=round(time.monotonic() - start, 1), format=FORMAT)
    _write_index(source, staging, final, rewrites, settings)
    meta = {"modality": twin.modality, "call": twin.call, "vae_tiling": twin.vae_tiling, "twin": twin.to_dict()}
    (staging / "ditgate.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return twin


def _components(source: Source, staging: Path, seed: int, needs, encoders, stand_ins, vocab, log, deeper: int):
    """Every component cut and rebuilt, copied or stood in for (`deeper`: see cut.plan); their summaries in the
    index's order and the text encoders' (before, after) depths."""
    summaries, depths, total = [], [], 0
    # text encoders first: a denoiser config may index their layers (cut.plan's encoder_depths); index order kept
    order = sorted(source.components.items(), key=lambda item: item[0] not in encoders)
    for name, component in order:
        summary: dict[str, Any] = {"name": name, "class": component.class_name}
        if component.kind == "none":
            summary.update(action="absent", why="the index names no class")
        elif component.kind == "config":
            if component.folder is not None:
                weights.copy_folder(component.folder, staging / name)
            summary.update(action="copied", why="configuration files")
        elif component.kind == "tokenizer":
            summary.update(stand_ins.get(name) or {"action": "copied", "why": "its tokenizer files (vocabulary kept)"})
        else:
            summary.update(_model(component, staging / name, seed, vocab.get(name), needs, name in encoders, depths,
                                  log, deeper if name.startswith("transformer") else 0))
            total += summary["params"]
            if total > MAX_TWIN_PARAMS:
                raise TwinError(f"the twin would hold over {MAX_TWIN_PARAMS:.0e} parameters by {name}: its widths "
                                "are beyond any real model (a config that lies?)")
        summaries.append(summary)
    summaries.sort(key=lambda s: list(source.components).index(s["name"]))
    return summaries, [after for _, after in depths]


def _index_and_call(source: Source, staging: Path, rewrites, needs, depths: list[int], given: dict[str, Any],
                    defaults):
    """The staging folder's index, root files and first ditgate.json (the call checks load it): the notes on
    rewritten layer arguments, the pipeline settings written and the base call."""
    layer_args = text.rewrite_layer_args(needs.layer_args, min(depths)) if needs.layer_args and depths else {}
    settings = text.rewrite_layer_args(needs.index_args, min(depths)) if needs.index_args and depths else {}
    notes = [f"{what} {k} rewritten {old[k]} -> {v} for the twin's {min(depths)}-layer text encoder"
             for what, old, new in (("call argument", needs.layer_args, layer_args),
                                    ("pipeline setting", needs.index_args, settings)) for k, v in new.items()]
    _write_index(source, staging, staging, rewrites, settings)  # the checks load the staging folder
    _copy_root(source, staging)
    base = call_mod.base_call(dict(source.meta.get("call") or {}), layer_args, given,
                              negative="negative_prompt" in defaults)
    if "prompt" not in given and not call_mod.takes(source.pipeline_cls, "prompt"):
        base.pop("prompt", None)  # a class-conditioned pipeline (DiTPipeline takes class_labels)
    (staging / "ditgate.json").write_text(json.dumps({"call": base, "vae_tiling": {}}, indent=2) + "\n")
    return notes, settings, base


def _tokenizers(source: Source, staging: Path, log):
    """Stand-ins for tokenizers without files: their summaries, index class rewrites, vocab changes per model."""
    summaries, rewrites, vocab = {}, {}, {}
    for name, component in source.components.items():
        if component.kind != "tokenizer" or component.has_tokenizer_files:
            if component.kind == "tokenizer" and component.folder is not None:
                weights.copy_folder(component.folder, staging / name)
            continue
        positions = [_config(source.components[m]).get("max_position_embeddings") for m in text.paired(source, name)
                     if source.components[m].library is TRANSFORMERS and source.components[m].folder is not None]
        tok = text.stand_in(component, positions=min((n for n in positions if is_int(n) and n > 0), default=None))
        text.save_stand_in(tok, staging / name)
        note = f"no tokenizer files: an offline {type(tok).__name__} stand-in of {len(text.tokenizer_of(tok))} tokens"
        try:
            if component.missing:
                raise ImportError(f"its class needs {', '.join(component.missing)}, not installed")
            component.cls.from_pretrained(str(staging / name))
        except Exception as exc:  # noqa: BLE001 - the index's class cannot read the stand-in: name the stand-in's
            rewrites[name] = type(tok).__name__
            note += f" (the index names {type(tok).__name__} instead of {component.class_name}: {one_line(exc)})"
        log(f"{name}: {note}")
        for model in text.paired(source, name):
            vocab[model] = tok
        summaries[name] = {"action": "stand-in", "why": note}
    return summaries, rewrites, vocab


def _config(component: Component) -> dict[str, Any]:
    what = f"component {component.name}"
    if component.library is TRANSFORMERS:
        try:
            return component.cls.config_class.from_pretrained(str(component.folder)).to_dict()
        except Exception as exc:  # noqa: BLE001 - the user's config: any failure to read it is reported
            raise TwinError(f"{what}: cannot read its config in {component.folder} ({one_line(exc)})") from None
    return read_json(component.folder / "config.json", what)


def _model(component: Component, out: Path, seed: int, tok, needs: text.Needs, is_encoder: bool, depths, log,
           deeper: int = 0):
    what = f"component {component.name}"
    config = _config(component)
    notes = []
    if tok is not None:
        changes = text.vocab_changes(config, tok)
        if changes:
            config = with_values(config, changes)
            notes.append(f"vocabulary cut to {changes[next(iter(changes))]} to match the stand-in tokenizer")
    summary: dict[str, Any] = {"notes": notes}
    if weights.is_vae(component):
        config, knob = _vae_knob(component, config, what)
        summary.update(action="whole", why=knob["why"], changes=knob["changes"], params_source=knob["before"])
    else:
        log(f"{component.name}: finding its block lists ({component.class_name})")
        plan = cut_mod.plan(component.cls, component.library, config, what,
                            min_layers=needs.layers if is_encoder else 1, need_reason=needs.reason,
                            denoiser=component.name.startswith("transformer"), encoder_depths=list(depths),
                            text=is_encoder, deeper=deeper)
        config = plan.config
        summary.update(cuts=[c.to_dict() for c in plan.cuts], params_source=plan.params_source,
                       changes={k: list(v) for k, v in plan.changes.items()}, whole_lists=plan.whole)
        if plan.cuts:
            summary["action"] = "cut"
        else:
            summary.update(action="whole", why="; ".join(f"{p}: {w}" for p, w in plan.whole.items())
                           or "no block lists")
        if is_encoder:
            main = [(c.before, c.after) for c in plan.cuts if not any(p in c.key for p in ("vision", "visual"))]
            depths.extend(main[:1])
    log(f"{component.name}: building and saving")
    built = weights.build(component, config, seed, out)
    summary["params"] = built["params"]
    if built["redrawn"]:
        summary["notes"].append(f"{len(built['redrawn'])} zero-initialised parameters drawn again "
                                f"({', '.join(built['redrawn'][:4])}{', ...' if len(built['redrawn']) > 4 else ''})")
    return summary


def _vae_knob(component: Component, config: dict[str, Any], what: str):
    changes = {(k,): 1 for k in weights.VAE_KNOBS if is_int(config.get(k)) and config[k] > 1}
    before = count(on_meta(component.cls, component.library, config, what))
    if not changes:
        return config, {"why": "no depth knob that keeps its widths and tiles", "changes": {}, "before": before}
    candidate = with_values(config, changes)
    try:
        on_meta(component.cls, component.library, candidate, what)
    except TwinError:
        return config, {"why": "its depth knob does not build", "changes": {}, "before": before}
    names = ", ".join(k[0] for k in changes)
    return candidate, {"why": f"widths, down-sampling and tiles kept; {names} cut to 1 (resnets per level)",
                       "changes": {k[0]: [config[k[0]], 1] for k in changes}, "before": before}


def _write_index(source: Source, staging: Path, final: Path, rewrites: dict[str, str],
                 settings: dict[str, Any] | None = None) -> None:
    index = json.loads(json.dumps(source.index))
    index.update(settings or {})
    for name, cls_name in rewrites.items():
        index[name] = [index[name][0], cls_name, *index[name][2:]]
    if source.modular:
        for name, entry in index.items():
            if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict) and name in \
                    source.components:
                entry[2]["pretrained_model_name_or_path"] = str(final)
    (staging / source.index_name).write_text(json.dumps(index, indent=2) + "\n")


def _copy_root(source: Source, staging: Path) -> None:
    """Root files besides the index and ditgate.json (a modular_config.json, a pipeline's code)."""
    for file in source.path.iterdir():
        if file.is_file() and file.name not in (source.index_name, "ditgate.json") \
                and not file.name.endswith(WEIGHT_SUFFIXES) and not (staging / file.name).exists():
            shutil.copy2(file, staging / file.name)


def _source_value(source: Source, name: str, key: str):
    component = source.components.get(name)
    if component is None or component.folder is None:
        return None
    return read_json(component.folder / "config.json", f"component {name}").get(key)


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
