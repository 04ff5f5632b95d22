"""Which module to name for a divergence: the module whose own forward introduced it.

The first output outside the tolerance is not always where the fault is. When that module's input already differs
while everything its caller computed before it matches, the fault is in the caller's own code between the two: for
an attention module, its processor (the attention itself runs between `to_q/k/v` and `to_out` and is no module).
The caller is the module whose forward was running when the diverging module was entered (recorded by
ditgate.run.diff.divergence), never a container such as `to_out` (a ModuleList has no forward of its own).

A replicated input split across the ranks is named as such: when the attention named is a cross-attention (its keys
come from a stream other than its queries) whose key/value stream reached the ranks split, the diff had stitched the
pieces back together (identical to the baseline), but the attention saw only its rank's piece. The headline is then
the split: the outermost module entered after that stream was last seen whole on every rank.
"""

from __future__ import annotations

import re
from typing import Any

from ditgate.run.diff.divergence import exact_metrics
from ditgate.run.diff.report import BEFORE

GATHERED = ("concatenated", "gathered")  # the notes of a tensor the diff made whole from the ranks' pieces


def module_of(key: str) -> str:
    return key.split(":")[0].split("[")[0].split("#")[0]


def roots(lines: list[dict]) -> set[str]:
    return {x["module"].split("[")[0] for x in lines if "." not in x["module"] and ":" not in x["module"]
            and x["module"].startswith("transformer")}


def locate(lines: list[dict], first: int, tol: float, window: int, rerun,
           declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """The module to name, from the summary pass's `lines` and their `first` divergence. `rerun(full, inputs)` runs
    the second pass and returns the whole tensors it kept, (baseline, candidate): those of the keys in `full`, and
    the first input of the modules in `inputs`; `declared`: the integration's CP_SPLIT_DIMS."""
    line = lines[first]
    if line["module"].split("[")[0] in roots(lines) and line["status"].startswith("shape"):
        split = [x for x in lines[:first] if x.get("gathered", "").startswith(GATHERED)]
        named = module_of(split[-1]["module"]) if split else line["module"]
        return {"first": line["module"], "named": named, "reason": (
            f"the transformer's output is still split across the ranks ({line['status']}): {named} is the last "
            f"module whose output is split; gather it there (a _ContextParallelOutput in the CP plan)")}
    keys = [x["module"] for x in lines[max(0, first - BEFORE): first + window + 1]]
    module = module_of(line["module"])
    bt, ct = rerun(set(keys), {module})
    for x in lines:
        if x["module"] in keys and x["module"] in bt and x["module"] in ct and bt[x["module"]].shape == ct[
                x["module"]].shape:
            x.update(exact_metrics(bt[x["module"]], ct[x["module"]]), exact=True)
            x["diverged"] = x["rel"] > tol
    now = next((i for i, x in enumerate(lines) if x["diverged"]), first)
    line, module = lines[now], module_of(lines[now]["module"])
    key_in = f"{module}:input"
    named, reason = module, f"{line['module']} is the first output outside the tolerance"
    if key_in in bt and key_in in ct and bt[key_in].shape == ct[key_in].shape:
        err = exact_metrics(bt[key_in], ct[key_in])
        caller = line.get("caller") or (module.rsplit(".", 1)[0] if "." in module else None)
        if err["rel"] > tol and caller:
            split = wrongly_split(lines, now, caller, declared)
            if split is not None:
                return {"first": line["module"], **split}
            named = caller
            inside = (f"its processor ({line['processor']}): the attention computed between its projections and "
                      f"{module.removeprefix(caller + '.')}" if line.get("processor") else "its functional code")
            reason = (f"{line['module']} is the first output outside the tolerance, but its input already differs "
                      f"(rel {err['rel']:.3g}) while every module {named} called before it matches: the fault is in "
                      f"{named}'s own forward, in {inside}")
        else:
            reason += f"; its input matches the baseline (rel {err['rel']:.3g}): the fault is inside {module}"
    skipped = [x["module"] for x in lines[:now] if x.get("skipped") is not None]
    if skipped:
        reason += (f" ({len(skipped)} per-rank tensor{'s' if len(skipped) > 1 else ''} before it could not be made "
                   f"whole and {'were' if len(skipped) > 1 else 'was'} not compared: {', '.join(skipped[:3])})")
    return {"first": line["module"], "named": named, "reason": reason}


def _dim(note: str) -> int | None:
    found = re.search(r"along dim (-?\d+)", note)
    return int(found.group(1)) if found else None


def _child(lines: list[dict], upto: int, caller: str, name: str) -> dict | None:
    return next((x for x in lines[:upto] if x.get("caller") == caller and x["module"] == f"{caller}.{name}"), None)


def _declared_whole(lines: list[dict], declared: dict[str, Any] | None) -> set[int]:
    """Token counts (dim 1) of the block-output streams an integration's CP_SPLIT_DIMS declares kept whole, less
    those of the streams it declares split."""
    whole, split = set(), set()
    for x in lines:
        found = re.fullmatch(r"(\w+)\.(.+)\.\d+\[(\d+)\]", x["module"])
        if not found or not declared or len(x.get("shape") or []) < 2:
            continue
        per_stream = declared.get(f"{found.group(1)}.{found.group(2)}", declared.get(found.group(2)))
        if isinstance(per_stream, (tuple, list)) and int(found.group(3)) < len(per_stream):
            (whole if per_stream[int(found.group(3))] is None else split).add(x["shape"][1])
    return whole - split


def wrongly_split(lines: list[dict], now: int, attention: str, declared: dict[str, Any] | None = None
                  ) -> dict[str, Any] | None:
    """The split to name when a stream `attention` needs whole reached the ranks split: the keys and values of a
    cross-attention (its `to_k` output gathered from pieces along a token dimension its queries do not share), or a
    stream the integration's CP_SPLIT_DIMS (`declared`) says is kept whole; None otherwise."""
    query, key = _child(lines, now, attention, "to_q"), _child(lines, now, attention, "to_k")
    if query is None or key is None or _child(lines, now, attention, "add_q_proj") is not None:
        return None  # not a (diffusers-style) attention, or a joint one: both streams are queries, split alike
    dim = _dim(key.get("gathered", ""))
    if dim is None or not key["gathered"].startswith(GATHERED) or len(key["shape"]) <= dim:
        return None  # its keys reached every rank whole
    tokens = key["shape"][dim]
    if tokens in _declared_whole(lines, declared):
        why = (f"a stream CP_SPLIT_DIMS declares kept whole ({tokens} tokens along dim {dim}) reaches {attention} "
               "split across the ranks")
    elif len(query["shape"]) > dim and query["shape"][dim] == tokens:
        return None  # self-attention: keys and queries are one stream; splitting it is the CP plan's job
    else:
        why = (f"a replicated input split across the ranks: the keys and values of {attention} ({tokens} tokens "
               f"along dim {dim}, a stream other than its queries) reach it split")
    same = [x for x in lines[:key["index"] + 1] if len(x.get("shape") or []) > dim and x["shape"][dim] == tokens
            and x.get("skipped") is None and x["status"] in ("identical", "differs")]
    whole = [x["index"] for x in same if not x.get("gathered", "").startswith(GATHERED)]
    last_whole = max(whole, default=-1)
    pieces = next(x for x in same if x["index"] > last_whole)  # the first output seen split (to_k at the latest)
    callers, entered = {}, {}
    for x in lines:
        callers.setdefault(module_of(x["module"]), x.get("caller"))
        entered.setdefault(module_of(x["module"]), x.get("entered", x["index"]))
    named, walk = module_of(pieces["module"]), callers.get(module_of(pieces["module"]))
    while walk is not None and entered.get(walk, -1) > last_whole:
        named, walk = walk, callers.get(walk)
    return {"named": named, "split": {"tokens": tokens, "dim": dim, "attention": attention,
                                      "first_split": pieces["module"]}, "reason": (
        f"{why}, first seen split at {pieces['module']} and still whole on every rank before {named} was entered. "
        f"Stitched back together ({key['gathered']}) the pieces equal the baseline's, but each rank's {attention} "
        f"attends to its own piece only, so its output differs. Keep that input whole on every rank (no "
        f"_ContextParallelInput for it at {named} in the CP plan), or gather it before this attention")}
