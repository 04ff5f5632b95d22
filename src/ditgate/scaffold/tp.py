"""The TP part of a scaffolded plugin: which Linears of a block structure are sharded (Colwise, Rowwise, or kept
whole), each choice with the comment that names its observation."""

from __future__ import annotations

from typing import Any


def _tp_layers(rows: list[dict[str, Any]], heads: int | None, across: set[str], chains: list[tuple[str, str]] = (),
               tp: int = 2, group_heads: dict[str, int] | None = None) -> tuple[dict[str, str], list[str]]:
    """The layer plan of one block structure: only pairs whose every member was observed; attention modules in
    `across` (a q/k norm over all heads) kept whole; a Linear reading another sharded Colwise never Colwise too.
    `group_heads`: each attention's own head count by its path in the block (else `heads`, the model's)."""
    names = {r["layer"]: r["style"] for r in rows}
    widths = {r["layer"]: (r.get("in"), r.get("out")) for r in rows}
    plan, notes, own = {}, [], group_heads or {}
    for layer in [n for n in names if n.endswith(".to_q")]:
        p = layer[: -len(".to_q")]
        qkv = [f"{p}.to_q", f"{p}.to_k", f"{p}.to_v"]
        out = next((n for n in (f"{p}.to_out.0", f"{p}.to_out") if n in names), None)  # a Linear, or a list's first
        if not all(n in names for n in qkv) or out is None:
            notes.append(f"`{p}` has no `to_out` Linear of its own (its heads feed a layer shared with other inputs): "
                         "kept whole; sharding it is the other choice, told apart by tp-2")
            continue
        if p in across:
            notes.append(f"`{p}` normalises q/k over all heads at once (observed norm width): sharding its heads "
                         "would normalise each shard alone, so it is kept whole; the other choice (shard it with a "
                         "norm over the gathered heads) is told apart by tp-2")
            continue
        h = own.get(p, heads)
        if h is None or h % tp:
            notes.append(f"`{p}`: {h} heads do not divide by {tp}: kept whole")
            continue
        kv = _kv_heads(widths, p, h)
        if kv is None or kv % tp:  # to_k/to_v Colwise would cut inside a key/value head, their count divided to 0
            notes.append(f"`{p}`: {kv or 'an unobserved number of'} key/value heads (to_k/to_v width over the head "
                         f"size) do not divide by {tp}: kept whole; sharding it is the other choice, told apart by "
                         "tp-2")
            continue
        plan.update({n: "ColwiseParallel()" for n in qkv})
        plan[out] = "RowwiseParallel()"
        added = [n for n in (f"{p}.add_q_proj", f"{p}.add_k_proj", f"{p}.add_v_proj") if n in names]
        if f"{p}.add_q_proj" in names and f"{p}.to_add_out" not in names:
            notes.append(f"`{p}` has text queries with no `to_add_out` of their own: kept whole")
            for n in qkv + [out]:
                plan.pop(n)
            continue
        plan.update({n: "ColwiseParallel()" for n in added})  # text keys/values (and queries): per head too
        if f"{p}.to_add_out" in names:
            plan[f"{p}.to_add_out"] = "RowwiseParallel()"
        notes.append(f"`{p}`: q/k/v read the block width and `{out[len(p) + 1:]}` "
                     f"reads their heads: Colwise then Rowwise, heads divided by {tp}")
    for layer in names:
        if layer.endswith(".net.0.proj") and names[layer].startswith("fused gated"):
            notes.append(f"`{layer}` is a fused gated MLP (its output chunked in two, one half through an activation "
                         "times the other): Colwise would give each rank the wrong halves, so the pair is kept whole; "
                         "the other choice (Colwise without relayout) is told apart by tp-2")
        elif layer.endswith(".net.0.proj") and layer.replace(".net.0.proj", ".net.2") in names:
            plan[layer] = "ColwiseParallel()"
            plan[layer.replace(".net.0.proj", ".net.2")] = "RowwiseParallel()"
            notes.append(f"`{layer}` feeds `{layer.replace('.net.0.proj', '.net.2')}` (a feed-forward pair): "
                         "Colwise then Rowwise; Colwise for both is the other choice and fails tp-2")
        elif names[layer].startswith("Colwise(output_layouts=Replicate())"):
            plan[layer] = "ColwiseParallel(output_layouts=Replicate())"
            notes.append(f"`{layer}`'s output is chunked on its features (modulation): Colwise gathered back whole")
    for second in [n for n in names if names[n].startswith("Rowwise (writes") and n not in plan]:
        firsts = [f for f, s in chains if s == second and f not in plan and names.get(f, "").startswith("Colwise (reads")
                  and widths[f][1] == widths[second][0]]
        if firsts:  # every Linear of the block width whose output reaches it (observed), e.g. an MLP's gate and up
            plan.update({f: "ColwiseParallel()" for f in firsts})
            plan[second] = "RowwiseParallel()"
            notes.append(f"{', '.join(f'`{f}`' for f in firsts)} read the block width and their outputs reach "
                         f"`{second}` (observed), which writes it back: Colwise then Rowwise (an MLP's hidden width "
                         "divided); kept whole is the other choice, told apart by tp-2")
    for first, second in chains:  # the first of a chained pair is sharded only when the second undoes it
        if first in names and first not in plan and plan.get(second) == "RowwiseParallel()" \
                and widths[first][1] not in (widths[second][0], own.get(second.split(".to_")[0], heads)):
            notes.append(f"`{first}`'s output reaches `{second}` (observed) but is {widths[first][1]} wide, neither "
                         f"the {widths[second][0]} features `{second}` reads split nor one per head: kept whole (a "
                         "gate broadcast over the features); Colwise is the other choice, told apart by tp-2")
        elif first in names and first not in plan and plan.get(second) == "RowwiseParallel()":
            plan[first] = "ColwiseParallel()"  # a Rowwise layer reads its input split on the features
            notes.append(f"`{first}`'s output reaches `{second}` (observed), which reads its features split over the "
                         f"ranks (RowwiseParallel): `{first}` Colwise, so its features split the same way (a gate "
                         f"over the heads, or one per head); kept whole is the other choice and fails tp-2")
        elif first in names and first not in plan and second in plan:
            notes.append(f"`{first}` feeds `{second}` (observed): `{first}` kept whole, `{second}` "
                         f"{plan[second]}; both Colwise is the other choice and fails tp-2")
    return plan, notes


def _kv_heads(widths: dict[str, tuple], p: str, heads: int) -> int | None:
    """The key/value head count of the attention `p`: its to_k and to_v widths over the head size (to_q's width over
    `heads`); None where they are unobserved or not whole heads."""
    q, k, v = (widths[f"{p}.{n}"][1] for n in ("to_q", "to_k", "to_v"))
    size = q // heads if q and q % heads == 0 else None
    return k // size if size and k and k == v and k % size == 0 else None


def _like(variants: list[dict[str, Any]], span_text: str) -> dict[str, str | None] | None:
    """The sub-layers by which the blocks of `span_text` differ from the list's other blocks ({name: class, None:
    absent}, from inspect's block variants), where no other group has the same: the plan then picks those blocks by
    structure, not by index, so that a transformer of another depth (the model's twin) gets its own. None where the
    groups differ in parameter shapes alone, or the span is no group."""
    def parse(row):
        pairs = [s.split(": ", 1) for s in row["sublayers"] if ": " in s]
        return {n: None if c == "absent" else c for n, c in pairs} if len(pairs) == len(row["sublayers"]) else None

    groups = [parse(r) for r in variants]
    mine = next((g for r, g in zip(variants, groups) if r["blocks"] == span_text), None)
    return mine if mine and groups.count(mine) == 1 else None
