"""Mixture-of-experts layers, found by what the parameters and the run show, not by names.

An expert layer is a module whose parameters carry an expert dimension (3-D, several matrices stacked on dim 0:
packed experts) or a list of identical feed-forwards; its router is the Linear beside them whose output width is the
expert count; a shared expert is any other feed-forward beside them that every token goes through. The routing is
read from the sorts the trace saw inside the layer: a top-k over the sequence (each expert picks its tokens from the
whole sequence: expert-choice) makes a token's route depend on the other tokens, so CP must gather the sequence
around the layer; a top-k over the experts (token-choice) decides per token and is split-safe.
"""

from __future__ import annotations

from typing import Any

from ditgate.inspect.variants import span, variants


def _packed(module) -> dict[str, list[int]]:
    import torch

    if isinstance(module, torch.nn.modules.conv._ConvNd):
        return {}
    return {name: list(p.shape) for name, p in module.named_parameters(recurse=False)
            if p.ndim >= 3 and p.shape[0] > 1}


def _expert_lists(module) -> int | None:
    """The number of experts of a ModuleList of identical feed-forwards (2 or more, each holding Linears)."""
    import torch

    if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
        return None
    kinds = {(type(m).__name__, tuple(tuple(p.shape) for p in m.parameters())) for m in module}
    has_linear = any(isinstance(x, torch.nn.Linear) for x in module[0].modules())
    return len(module) if len(kinds) == 1 and has_linear else None


def _routing(layer: str, sorts: list[dict[str, Any]]) -> tuple[str, str]:
    """(kind, evidence) of the routing inside `layer` (a group path, block index as `*`)."""
    inside = [s for s in sorts if s["module"] == layer or s["module"].startswith(layer + ".")]
    over_sequence = [s for s in inside if s["over_sequence"]]
    if over_sequence:
        s = over_sequence[0]
        return "expert-choice", (f"{s['op']} over dim {s['dim']} of {s['shape']} ({s['shape'][s['dim']]} = the "
                                 "sequence): each expert picks its tokens from the whole sequence, so a token's route "
                                 "depends on the other tokens")
    if inside:
        s = inside[0]
        return "token-choice", (f"{s['op']} over dim {s['dim']} of {s['shape']} (not the sequence): each token "
                                "picks its experts from its own scores, whatever the other tokens are")
    return "not observed", "no top-k or sort ran inside the layer on the observed call"


def _layer_and_router(block, path: str, count: int) -> tuple[str, str | None]:
    """The closest module (the experts' own or a parent) holding a Linear of `count` outputs outside the experts,
    and that Linear's path relative to it."""
    import torch

    parts = path.split(".") if path else []
    for cut in range(len(parts), -1, -1):
        candidate = ".".join(parts[:cut])
        owner = block.get_submodule(candidate) if candidate else block
        inner = ".".join(parts[cut:])
        for name, m in owner.named_modules():
            if inner and (name == inner or name.startswith(inner + ".")):
                continue
            if isinstance(m, torch.nn.Linear) and m.out_features == count:
                return candidate, name
    return path, None


def find_experts(t_name: str, lists: dict[str, Any], sorts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding per expert layer of each structure of each block list (see the module's docstring)."""
    import torch

    found = []
    for attribute, blocks in lists.items():
        for group in variants(blocks):
            block = blocks[group[0]]
            for path, module in block.named_modules():
                packed = _packed(module)
                listed = _expert_lists(module)
                if not packed and not listed:
                    continue
                count = next(iter(packed.values()))[0] if packed else listed
                layer_path, router = _layer_and_router(block, path, count)
                if listed and router is None:
                    continue  # a list of like modules with no router beside it is no expert layer
                if not layer_path:  # the block routes itself: the experts' module stands for the layer
                    layer_path, router = path, None
                layer = block.get_submodule(layer_path)
                experts_rel = path[len(layer_path) + 1:] if path != layer_path else ""
                shared = [n for n, child in layer.named_children()
                          if n != experts_rel.split(".")[0] and n != (router or "").split(".")[0]
                          and any(isinstance(x, torch.nn.Linear) for x in child.modules())]
                group_path = f"{attribute}.*.{layer_path}"
                kind, evidence = _routing(group_path, sorts)
                found.append({
                    "layer": f"{t_name}.{group_path}", "blocks": f"{attribute} {span(group)}", "experts": count,
                    "packed": {f"{path}.{k}" if path else k: v for k, v in packed.items()},
                    "expert_list": path if listed else None,
                    "router": f"{layer_path}.{router}" if router else None, "routing": kind, "evidence": evidence,
                    "shared": [f"{layer_path}.{n}" for n in shared]})
    return _dedupe(found)


def _dedupe(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for f in found:
        key = (f["layer"], f["blocks"])
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def plan_lines(found: list[dict[str, Any]]) -> list[str]:
    """What CP and TP must do about each expert layer."""
    lines = []
    for f in found:
        what = (f"packed experts {', '.join(f'`{k}` {v}' for k, v in f['packed'].items())}" if f["packed"]
                else f"a list of {f['experts']} experts `{f['expert_list']}`")
        lines.append(f"- `{f['layer']}` (blocks {f['blocks']}): {f['experts']} experts ({what}); router "
                     f"`{f['router'] or 'not found'}`; shared expert(s) {f['shared'] or 'none'}; routing "
                     f"{f['routing']}: {f['evidence']}")
        if f["routing"] == "expert-choice":
            lines.append(f"  CP: gather the sequence before `{f['layer'].split('.', 1)[-1]}` and split it again "
                         "after (routing on each rank's share picks other tokens); cp-ulysses-2 tells it apart")
        lines.append("  TP: the packed experts are no Linear (Colwise/Rowwise cannot take them): keep them and the "
                     "router replicated, or shard each expert's hidden dimension by hand; the shared expert is a "
                     "feed-forward pair (Colwise then Rowwise); tp-2 tells them apart")
    return lines
