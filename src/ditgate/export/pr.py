"""The pull-request description of an export: what it adds, the gate table of the run that proved it, the written
test's outcome, and what cache-dit would need for what could not be exported."""

from __future__ import annotations

import difflib

from ditgate.export.prove import table


def added(old, new) -> str:
    """Lines a file gains: `+N` (a new file: its line count), "binary" for bytes."""
    if isinstance(new, bytes):
        return "binary"
    if old is None:
        return str(len(new.splitlines()))
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    plus = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    return f"+{plus}"


def description(result, failure: str | None) -> str:
    names, tree = result.names, result.tree
    out = [f"# {names.prefix}: cache adapter, context- and tensor-parallel planners, example and test", ""]
    if failure:
        out += [f"**Not exported: {failure}.**", ""]
    out += [f"Adds {names.pipeline_class} ({names.transformer_class}) to cache-dit's registries, so that "
            "`cache_dit.enable_cache(pipe, ...)` and `ParallelismConfig(...)` work for it without any plugin. "
            f"Rows: {', '.join(result.rows)}.", "", "## Files", "", "| file | lines | what |", "|---|---|---|"]
    for rel, (old, new) in sorted(result.before.items()):
        out.append(f"| `{rel}` | {added(old, new)} | {_what(rel)} |")
    if result.proof is not None:
        source = (result.proof.get("versions") or {}).get("cache_dit_from", "?")
        out += ["", "## Proof: the rows with no integration file", "",
                f"`ditgate run` with the exported tree first on the import path (cache-dit imported from a staged "
                f"copy of the tree with this change applied: `{source}`), model dtype {result.proof.get('dtype')}:",
                "", table(result.proof)]
    if result.pytest is not None:
        out += ["## The added test", "",
                f"`pytest {result.test_rel}` in a process that imports no ditgate: **{result.pytest['summary']}** "
                f"({result.pytest['wall_s']} s wall, CPU, gloo, float32).", ""]
        if not result.pytest["passed"]:
            out += ["```", *result.pytest["tail"], "```", ""]
    if result.gate is not None:
        out += ["## The integration file's own run", "", table(result.gate)]
    if result.left_out:
        out += ["## Not exported", "", *[f"- {item}" for item in result.left_out], ""]
    if result.upstream:
        out += ["## What cache-dit would need", "", *[f"- {item}" for item in result.upstream], ""]
    return "\n".join(out) + "\n"


def _what(rel: str) -> str:
    if rel.endswith("block_adapters/adapters.py"):
        return "the registered BlockAdapter function"
    if rel.endswith("block_adapters/__init__.py"):
        return "imports it like every built-in adapter"
    if "patch_functors/" in rel:
        return "what the adapter patches"
    if rel.endswith("transformers/planners.py"):
        return "activates the planners"
    if "distributed/transformers/" in rel:
        return "CP/TP planners with their processors and helpers"
    if rel.endswith("_utils/examples.py"):
        return "cache-dit-generate example"
    if "/test_" in rel:
        return "the per-model test (twin, CPU, gloo)"
    if "_twin/code/" in rel:
        return "the model's own code (outside diffusers)"
    return "the twin's config folder"
