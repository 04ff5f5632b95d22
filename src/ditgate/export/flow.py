"""`ditgate export`, step by step: compose every file into the tree's pending edits (refusing a tree that already
registers the name), run the rows with the integration file (a file that fails them is not exported), prove the
export on a staged copy of the tree (the same rows with no file and that copy first on the import path, and the
written test under pytest without ditgate), and only then write the tree, the patch and the PR description.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditgate.core import logs
from ditgate.export import code_edits, prove, written
from ditgate.export.compose import Names
from ditgate.export.source import Source
from ditgate.export.tree import EXAMPLES, ExportError, Tree


@dataclass
class Export:
    names: Names
    tree: Tree
    rows: list[str]
    out: Path
    upstream: list[str] = field(default_factory=list)  # what cache-dit would need for what was not exported
    left_out: list[str] = field(default_factory=list)  # hooks of the file not exported (no chosen row proves them)
    test_rel: str = ""
    status: str = "pending"  # unchanged | exported | failed
    gate: dict[str, Any] | None = None
    proof: dict[str, Any] | None = None
    pytest: dict[str, Any] | None = None
    written: list[str] = field(default_factory=list)
    before: dict[str, tuple] = field(default_factory=dict)  # file -> (its content before or None, the new content)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.names.pipeline_class, "prefix": self.names.prefix, "tree": str(self.tree.root),
                "status": self.status, "rows": self.rows, "upstream": self.upstream, "left_out": self.left_out,
                "test": self.test_rel,
                "written": self.written, "lines": {rel: _count(old, new) for rel, (old, new) in self.before.items()},
                "gate_passed": (self.gate or {}).get("passed"),
                "proof_passed": (self.proof or {}).get("passed"), "pytest": self.pytest,
                "proof_cache_dit": ((self.proof or {}).get("versions") or {}).get("cache_dit_from"),
                "out": str(self.out)}


def _count(old, new) -> str:
    from ditgate.export.pr import added

    return added(old, new)


def _classes(model) -> tuple[str, str, str]:
    """(pipeline class, its module, transformer class) from the model folder's index."""
    index_file = model.path / ("modular_model_index.json" if model.is_modular else "model_index.json")
    if not index_file.is_file():
        index_file = model.path / "model_index.json"
    index = json.loads(index_file.read_text())
    spec = index.get("_class_name")
    pipeline, module = (spec[1], spec[0]) if isinstance(spec, list) else (spec, "diffusers")
    if model.pipeline and ":" in model.pipeline:
        module, pipeline = model.pipeline.split(":", 1)
    entry = index.get("transformer")
    transformer = None
    if isinstance(entry, list):
        transformer = entry[1] if isinstance(entry[1], str) else None
        if transformer is None and len(entry) > 2 and isinstance(entry[2], dict):  # modular: [lib, cls, spec]
            transformer = entry[2].get("type_hint", [None, None])[1]
    if transformer is None:
        raise ExportError(f"{model.path}: its index names no transformer class; export needs one")
    return pipeline, module, transformer


def plan(model, integration: Path, to: Path, out: Path | None, rows: list[str] | None,
         model_id: str | None) -> Export:
    """Everything the export would write, composed into the tree's pending edits; nothing run or written yet."""
    from ditgate import twin as twin_mod
    from ditgate.core import plugin

    tree = Tree.open(to)
    loaded = plugin.load(integration)
    source = Source.read(integration)
    pipeline, module, transformer = _classes(model)
    names = Names.of(pipeline, transformer)
    hooks = [h for h in ("block_adapter", "cp_plan", "tp_plan") if getattr(loaded, h) is not None]
    chosen = rows or prove.rows_for(hooks)
    proven = prove.hooks_of(chosen)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    result = Export(names=names, tree=tree, rows=chosen, out=Path(out or Path("runs") / f"export-{names.slug}-{stamp}"))
    result.left_out = [f"{hook}: no chosen row proves it (rows: {', '.join(chosen)})"
                       for hook in sorted(set(hooks) - proven)]
    result.left_out += [f"{item} (a statement the file runs at import; the export moves definitions, assignments "
                        "and imports only, and the proof runs without it)" for item in source.statements]
    code_edits(tree, source, names, proven & set(hooks))
    if "tp_plan" in proven & set(hooks) and "cp_plan" not in proven & set(hooks):
        result.upstream.append(
            "a TP-only planner module: cache-dit activates each planner registry only while it is empty, and a "
            "module registers its CP and TP planners together, so in a process whose CP planners were activated "
            "first (a hybrid or CP run before a TP one) the TP-only modules (this one, mochi, hunyuan_dit, "
            "ltx_video, ltx2_video, glm_image, kandinsky5) are never imported and TP fails 'No planner registered'; "
            "upstream would need _activate_tp_planners to run in full whatever the registry holds")
    if model.is_modular:
        result.upstream.append(
            f"{pipeline} is a ModularPipeline: cache-dit 1.5.3's enable_cache(pipe) refuses one, so the adapter "
            f"registered under {names.prefix!r} is called from the registry by prefix and handed to "
            "enable_cache(adapter); upstream would need enable_cache to accept a ModularPipeline (find the adapter "
            "by the modular class's or the transformer's name, count transformer calls per step from its guider), "
            "BlockAdapterRegister.get_adapter to accept one (it asserts an nn.Module), its forward hooks to keep "
            "the transformer's signature (modular denoisers read inspect.signature(transformer.forward) to pick "
            "the arguments they pass; the written test sets it back), and cache-dit-generate to load modular "
            "pipelines")
    twin = twin_mod.cached(model.name, pipeline=model.pipeline, trust_remote_code=model.trust_remote_code,
                           seed=model.request.seed, quiet=True)
    twin_rel = written.twin_folder(tree, names, twin.folder, exclude={integration})
    parallel = {name.removeprefix("cp-"): _parallel_of(name) for name in chosen if _parallel_of(name)}
    from ditgate.run.define.rows import DEFAULT_CACHE

    cache = {k: v for k, v in DEFAULT_CACHE.items() if k != "mask"}
    result.test_rel = f"{written.tests_prefix(tree)}/test_{names.slug}_parallel.py"
    test_text = written.test_file(names, twin_rel, twin.call, twin.seed, parallel,
                                  "block_adapter" in proven and "block_adapter" in hooks, cache,
                                  integration.name)
    if not tree.holds(result.test_rel, test_text):
        raise ExportError(f"{tree.root / result.test_rel} exists with other content: the tree already holds a test "
                          "for this model")
    tree.files[result.test_rel] = test_text
    entry, why_not = (None, "a ModularPipeline: cache-dit-generate loads pipelines with from_pretrained") \
        if model.is_modular else written.example_entry(
            names, model_id or written.check_model_id(_model_id(model), "the model's name"), twin.modality, module,
            model.request.call,
            model.trust_remote_code, bool(model.request.image_key))
    if entry:
        block = f"{names.marker(integration.name)}\n{entry}"
        current = tree.current(EXAMPLES)
        if f'ExampleRegister.register("{names.slug}"' in current.replace(block, ""):
            raise ExportError(f"{tree.root} already registers the example {names.slug!r} ({EXAMPLES}): export into "
                              "a tree without it")
        tree.append(EXAMPLES, block)
    elif why_not:
        result.upstream.append(f"no cache-dit-generate example: {why_not}")
    return result


def _parallel_of(row: str) -> dict[str, int] | None:
    from ditgate.run.define.rows import DEFAULT_ROWS

    found = next((r for r in DEFAULT_ROWS if r.name == row), None)
    return dict(found.parallel) if found is not None and found.parallel and not found.cache else None


def _model_id(model) -> str:
    name = str(model.name)
    return name if not (model.is_zoo or Path(name).exists()) else Path(model.path).name


def run(model, integration: Path, to: Path, *, out: Path | None = None, rows: list[str] | None = None,
        model_id: str | None = None) -> Export:
    result = plan(model, Path(integration).resolve(), Path(to), out, rows, model_id)
    tree = result.tree
    if not tree.changed():
        result.status = "unchanged"
        logs.progress(f"export: {tree.root} already holds this export; nothing written")
        return result
    tree.check_writable()
    result.before = {rel: (_old(tree.root / rel, data), data) for rel, data in tree.changed().items()}
    result.out.mkdir(parents=True, exist_ok=True)
    logs.progress(f"export: running {', '.join(result.rows)} with {integration}")
    result.gate = prove.gate_run(model, Path(integration).resolve(), result.rows, result.out / "with-integration")
    if not result.gate.get("passed"):
        result.status = "failed"
        _write_notes(result, "the integration file fails its rows: nothing exported")
        return result
    with tempfile.TemporaryDirectory(prefix="ditgate-export-") as tmp:
        stage = Tree(root=Path(tmp) / tree.root.name, files=dict(tree.files))
        shutil.copytree(tree.root / "cache_dit", stage.root / "cache_dit",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        stage.write()
        split = _split_dims(integration)
        result.proof = prove.proof_run(model, stage.root, result.rows, result.out / "proof", split)
        result.pytest = prove.pytest_run(stage.root / result.test_rel, stage.root)
    if not (result.proof.get("passed") and result.pytest["passed"]):
        result.status = "failed"
        _write_notes(result, "the proof failed: nothing exported")
        return result
    patch = tree.patch()
    result.written = tree.write()
    result.status = "exported"
    _write_notes(result, None, patch)
    return result


def _old(path: Path, data):
    if not path.is_file():
        return None
    return path.read_bytes() if isinstance(data, bytes) else path.read_text()


def _split_dims(integration: Path) -> dict | None:
    from ditgate.core import plugin

    return plugin.load(integration).cp_split_dims


def _write_notes(result: Export, failure: str | None, patch: str | None = None) -> None:
    from ditgate.export import pr

    result.out.mkdir(parents=True, exist_ok=True)
    if patch is not None:
        (result.out / "export.patch").write_text(patch)
    (result.out / "PR.md").write_text(pr.description(result, failure))
    (result.out / "export.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
