"""Checks that a row's feature really acted, from the facts its probes recorded.

A parallel output equal to the baseline proves nothing if nothing was split; a cached output proves nothing if no
step was cached. Each check compares the row's facts with those of the row it is compared with.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ditgate.core.steps import step_ranges
from ditgate.run.define.rows import Row


@dataclass(frozen=True)
class Proof:
    feature: str
    passed: bool
    detail: str
    coverage: dict[str, str] | None = None  # transformer -> "acted" | "did not act" | "not covered" (declared)

    def to_dict(self) -> dict[str, Any]:
        found = asdict(self)
        if not self.coverage:
            found.pop("coverage")
        return found


def partial(coverage: dict[str, str] | None) -> bool:
    """The feature acted on one transformer and not on another the pipeline called (undeclared)."""
    states = set((coverage or {}).values())
    return "acted" in states and "did not act" in states


def acted_word(proof: dict[str, Any]) -> str:
    """How report.md names what a stored proof saw: acted, acted on part (a transformer left out), did not act."""
    if proof["passed"]:
        return "acted"
    return "ACTED ON PART (a transformer left out)" if partial(proof.get("coverage")) else "DID NOT ACT"


def _owner(key: str) -> str:
    return key.split(".", 1)[0]


def served(name: str, facts: dict[str, Any]) -> str:
    """A transformer and the calls it serves: "transformer_2 (22 calls, steps 5-15)"."""
    calls = (facts.get("calls_by_transformer") or {}).get(name)
    steps = (facts.get("steps_by_transformer") or {}).get(name)
    said = [f"{calls} call{'s' * (calls != 1)}"] if calls is not None else []
    return f"{name} ({', '.join(said + ([step_ranges(steps)] if steps else []))})" if said else name


def coverage(feature: str, acted: dict[str, bool], facts: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """Whether `feature` covered every transformer the pipeline called: (the reason it did not, or None;
    {transformer: "acted" | "did not act" | "not covered"}). A transformer the integration declares in NOT_COVERED
    is "not covered" when the feature left it alone, and a reason when the feature acted on it after all."""
    declared = set(((facts.get("not_covered") or {}).get(feature)) or [])
    states = {t: "acted" if did else ("not covered" if t in declared else "did not act") for t, did in acted.items()}
    unknown = sorted(declared - set(acted))
    if unknown:
        return (f"NOT_COVERED names {', '.join(unknown)} for {feature}, which the pipeline did not call "
                f"(it called {', '.join(acted) or 'no transformer'})"), states
    wrong = [t for t in acted if t in declared and acted[t]]
    if wrong:
        return (f"{', '.join(served(t, facts) for t in wrong)}: declared in NOT_COVERED for {feature}, yet {feature}"
                " acted on it: take it out of the declaration"), states
    left = [t for t, state in states.items() if state == "did not act"]
    done = [t for t, state in states.items() if state == "acted"]
    if left and done:
        return (f"{feature} acted on {', '.join(served(t, facts) for t in done)} and not on "
                f"{', '.join(served(t, facts) for t in left)}: every transformer the pipeline calls must be covered "
                f"(or declared in the integration: NOT_COVERED = {{\"{feature}\": {json.dumps(left)}}})"
                ), states
    return None, states


def _each(acted: dict[str, bool], facts: dict[str, Any], what: str) -> str:
    done = [t for t, did in acted.items() if did]
    return f"; {', '.join(served(t, facts) for t in done)}: each {what}" if len(acted) > 1 else ""


def _not_covered(states: dict[str, str]) -> str:
    left = [t for t, state in states.items() if state == "not covered"]
    return f"; not covered (declared in NOT_COVERED): {', '.join(left)}" if left else ""


def _cache(facts: dict[str, Any]) -> Proof:
    stats = facts.get("cache") or []
    cached = sorted({s for entry in stats for s in entry.get("cached_steps", [])})
    transformer_calls = facts.get("transformer_calls", 0)
    # the fewest calls of any block of a list (Fn/Bn blocks always run; a cached step skips the ones between);
    # results from before block_calls was recorded only have the last block's count
    calls = {k: min(v) for k, v in facts["block_calls"].items() if v} if facts.get("block_calls") \
        else facts.get("last_block_calls", {})
    by_transformer = facts.get("calls_by_transformer") or {}
    own = lambda key: by_transformer.get(_owner(key), transformer_calls)  # noqa: E731 - calls of the list's transformer
    skipped = {k: own(k) - v for k, v in calls.items() if 0 < v < own(k)}
    if not cached:
        diffs = [round(v, 4) for entry in stats for v in entry.get("residual_diffs", {}).values()]
        return Proof("cache", False, "cache-dit cached no step (summary: cached_steps empty); residual diffs "
                     f"{diffs[:8]} never fell under the threshold, or the warm-up covered every step")
    if not skipped:
        return Proof("cache", False, f"summary reports cached steps {cached}, but every block of every block list"
                     f" ran on all {transformer_calls} transformer calls: no block was skipped")
    acted = {t: any(_owner(k) == t for k in skipped) for t, n in by_transformer.items() if n}
    problem, states = coverage("cache", acted, facts)
    if problem:
        return Proof("cache", False, problem, states)
    lists = ", ".join(f"{k.split('.', 1)[-1] if len(by_transformer) <= 1 else k} {n} of {own(k)}"
                      for k, n in skipped.items())
    return Proof("cache", True, f"cached steps {cached}; block calls skipped (the most-skipped block of each list): "
                 f"{lists}" + _each(acted, facts, "cached") + _not_covered(states), states)


def split_dim(key: str, declared: dict[str, Any] | None) -> tuple[int | None, bool]:
    """The dimension CP divides in what block list `key` ("transformer.blocks") returns, and whether it was declared
    (an integration's CP_SPLIT_DIMS, by full key or by attribute); undeclared lists split dimension 1."""
    for name in (key, key.split(".", 1)[-1]):
        if declared and name in declared:
            return declared[name], True
    return 1, False


def _cache_cfg(facts: dict[str, Any]) -> Proof | None:
    """A modular pipeline's guider decides the transformer calls per step; cache-dit must count steps the same way."""
    separate = (facts.get("modular") or {}).get("separate_cfg")
    calls = facts.get("calls_per_step")
    if facts.get("scheduler_steps") and facts.get("transformer_calls"):  # the steps the call made (img2img: fewer)
        calls = facts["transformer_calls"] / facts["scheduler_steps"]
    if separate is None or calls is None:
        return None
    expected = 2 if separate else 1
    text = (f"cache-dit counted steps with has_separate_cfg={separate} ({expected} transformer call(s) per step); "
            f"the pipeline made {calls:g} per step")
    if calls != expected:
        return Proof("cache-cfg", False, text + ": set has_separate_cfg on the BlockAdapter to "
                     f"{calls > 1} (the guider decides; references/modular_pipeline.md)")
    return Proof("cache-cfg", True, text)


def _cp(row: Row, facts: dict[str, Any], base: dict[str, Any], base_row: Row) -> Proof:
    got, ref = facts.get("block_shapes"), base.get("block_shapes")
    if not got or not ref:  # a result stored before block shapes were recorded
        return _cp_tokens(row, facts, base, base_row)
    keys = [k for k in ref if k in got and ref[k]]
    if not keys:
        return Proof("cp", False, "no block output was observed, so the sequence split cannot be checked")
    several = len({_owner(k) for k in keys}) > 1
    lists: dict[str, list[tuple[str, str]]] = {}  # transformer -> (state, text) of each of its lists
    for key in keys:
        name = key.split(".", 1)[-1] if _owner(key) == "transformer" and not several else key
        lists.setdefault(_owner(key), []).append(_cp_list(name, key, row, facts, got[key], ref[key], base_row))
    acted = {t: not all(state == "whole" for state, _ in found) for t, found in lists.items()}
    problem, states = coverage("cp", acted, facts)
    bad = [text for t, found in lists.items() for state, text in found
           if state == "bad" or (state == "whole" and states[t] != "not covered")]
    if problem:
        return Proof("cp", False, problem + (": " + "; ".join(bad) if bad else ""), states)
    if bad:
        return Proof("cp", False, "a block list was not divided by the CP size: " + "; ".join(bad), states)
    good = [text for t, found in lists.items() if states[t] == "acted" for _, text in found]
    return Proof("cp", True, "; ".join(good) + f" ({row.cp_size} ranks)" + _each(acted, facts, "split")
                 + _not_covered(states), states)


def _cp_list(name: str, key: str, row: Row, facts: dict[str, Any], got: list, ref: list,
             base_row: Row) -> tuple[str, str]:
    """One block list under CP: ("split" | "whole" (as on one device, not declared so) | "bad", what was seen)."""
    dim, declared = split_dim(key, facts.get("cp_split_dims"))
    said = " (CP_SPLIT_DIMS)" if declared else ""
    if isinstance(dim, (tuple, list)):
        return _cp_streams(name, tuple(dim), row, got, ref, base_row)
    mine, theirs = [s for s in got if len(s) >= 3], [s for s in ref if len(s) >= 3]
    if dim is None:
        if mine == theirs:
            return "split", f"{name}: whole on every rank, as declared"
        return "bad", f"{name}: declared whole (None), but it returned {mine} per rank, {theirs} on one device"
    if not theirs or any(len(s) <= dim for s in theirs) or len(mine) != len(theirs):
        return "bad", (f"{name}: returned {theirs} on one device and {mine} per rank, which has no dimension "
                       f"{dim}{said} to compare")
    full, local = sum(s[dim] for s in theirs), sum(s[dim] for s in mine)
    expected = full * base_row.cp_size / row.cp_size
    unit = "tokens" if dim == 1 else f"on dimension {dim}"
    if local == expected:
        return "split", f"{name}: {full} {unit} split into {local} per rank{said}"
    # a stream the ranks do not divide, padded up to a length they do before the split (masked padding tokens)
    padded = sum(-(-s[dim] * base_row.cp_size // row.cp_size) for s in theirs)
    if local == padded and local != full and not float(expected).is_integer():
        return "split", (f"{name}: {full} {unit} split into {local} per rank{said}, each stream padded to a length "
                         f"the {row.cp_size} ranks divide")
    text = f"{name}: {local} {unit} per rank{said}, expected {expected:g} ({full} / {row.cp_size})"
    return ("whole" if mine == theirs else "bad"), text


def _cp_streams(name: str, dims: tuple, row: Row, got: list, ref: list, base_row: Row) -> tuple[str, str]:
    """A block list declared per stream (`(1, None)`): tensor i of what block 0 returned is divided by the CP size on
    dims[i], or, for None, is the same on every rank as on one device."""
    if len(got) != len(dims) or len(ref) != len(dims):
        return "bad", (f"{name}: CP_SPLIT_DIMS declares {len(dims)} streams {_dims_text(dims)}, but its blocks "
                       f"returned {len(ref)} tensor(s) on one device ({ref}) and {len(got)} per rank ({got})")
    split, whole, bad = [], [], []
    for i, (dim, mine, theirs) in enumerate(zip(dims, got, ref)):
        if dim is None:
            (whole if mine == theirs else bad).append(
                f"stream {i}: {theirs} whole on every rank, as declared" if mine == theirs else
                f"stream {i}: declared whole (None), but {mine} per rank against {theirs} on one device")
            continue
        expected = theirs[dim] * base_row.cp_size / row.cp_size if dim < len(theirs) else None
        if expected is None or dim >= len(mine) or mine[dim] != expected or \
                [n for d, n in enumerate(mine) if d != dim] != [n for d, n in enumerate(theirs) if d != dim]:
            bad.append(f"stream {i}: {mine} per rank, expected dimension {dim} of {theirs} divided by {row.cp_size}"
                       + (f" ({expected:g})" if expected is not None else ""))
        else:
            split.append(f"stream {i}: {theirs[dim]} on dimension {dim} split into {mine[dim]} per rank")
    if bad:
        state = "whole" if not split and got == ref else "bad"
        return state, f"{name} (CP_SPLIT_DIMS {_dims_text(dims)}): " + "; ".join(bad + split + whole)
    return "split", f"{name} (CP_SPLIT_DIMS {_dims_text(dims)}): " + "; ".join(split + whole)


def _dims_text(dims: tuple) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in dims) + ")"


def _cp_tokens(row: Row, facts: dict[str, Any], base: dict[str, Any], base_row: Row) -> Proof:
    """The CP proof on the token counts alone (dimension 1 of every list), for results without block shapes."""
    got, ref = facts.get("block_seq_len", {}), base.get("block_seq_len", {})
    keys = [k for k in ref if k in got]
    if not keys:
        return Proof("cp", False, "no block input was observed, so the sequence split cannot be checked")
    bad = [f"{k.split('.', 1)[-1]}: {got[k]} tokens per rank, expected {ref[k] * base_row.cp_size / row.cp_size:g}"
           for k in keys if got[k] != ref[k] * base_row.cp_size / row.cp_size]
    if bad:
        return Proof("cp", False, "the sequence entering the blocks was not divided: " + "; ".join(bad))
    return Proof("cp", True, f"{ref[keys[0]]} tokens split into {got[keys[0]]} per rank ({row.cp_size} ranks)")


def _sharded(feature: str, facts: dict[str, Any], components: list[str], every: bool = False) -> Proof:
    """Weights of `components` are sharded DTensors (of each of them when `every`: every transformer)."""
    sharded = facts.get("sharded") or {}
    found = {name: sharded[name] for name in components if name in sharded}
    total = sum(v["sharded"] for v in found.values())
    wrong = [w for v in found.values() for w in v["wrong_size"]]
    if total == 0:
        return Proof(feature, False, f"no weight of {', '.join(components) or 'the component'} is a sharded DTensor")
    states, each = None, ""
    if every:
        called = facts.get("calls_by_transformer")
        acted = {n: bool(v["sharded"]) for n, v in found.items() if called is None or called.get(n)}
        problem, states = coverage(feature, acted, facts)
        if problem:
            return Proof(feature, False, problem + "; " + ", ".join(
                f"{n}: {v['sharded']} weights sharded" for n, v in found.items() if n in acted), states)
        each = _each(acted, facts, "sharded")
    if wrong:
        return Proof(feature, False, f"shards of the wrong size: {', '.join(wrong[:5])}", states)
    return Proof(feature, True, ", ".join(f"{name}: {v['sharded']} weights sharded" for name, v in found.items()
                                          if v["sharded"]) + each + _not_covered(states or {}), states)


def _vae(facts: dict[str, Any], base: dict[str, Any]) -> Proof:
    got, ref = facts.get("decoder_calls", 0), base.get("decoder_calls", 0)
    if ref <= 1:
        return Proof("vaep", False, f"the reference decoded in {ref} call(s): the image is too small to tile, so "
                     "VAE parallelism has nothing to split (use a larger size)")
    if got >= ref:
        return Proof("vaep", False, f"rank 0 ran the decoder {got} times, as many as the tiled reference ({ref})")
    return Proof("vaep", True, f"rank 0 decoded {got} of {ref} tiles")


def check(row: Row, facts: dict[str, Any], base_row: Row, base_facts: dict[str, Any]) -> list[Proof]:
    proofs = []
    parallel = row.parallel or {}
    if row.cache is not None:
        proofs.append(_cache(facts))
        cfg = _cache_cfg(facts)
        if cfg is not None:
            proofs.append(cfg)
    if row.cp_size > 1:
        proofs.append(_cp(row, facts, base_facts, base_row))
    if row.tp_size > 1:
        proofs.append(_sharded("tp", facts, [k for k in (facts.get("sharded") or {}) if k.startswith("transformer")],
                               every=True))
    if parallel.get("text_encoder"):
        proofs.append(_sharded("tep", facts, [k for k in (facts.get("sharded") or {}) if k.startswith("text_encoder")]))
    if parallel.get("vae"):
        proofs.append(_vae(facts, base_facts))
    if row.quantize:
        proofs.append(_counted("quantization", facts.get("quantized"), "weight(s) held quantized",
                               "no transformer weight is a quantized tensor: the quantization did not act"))
    if row.compile:
        proofs.append(_counted("compile", facts.get("compiled"), "module(s) compiled",
                               "no transformer module was wrapped by torch.compile"))
    return proofs


def _counted(feature: str, counts: dict[str, int] | None, what: str, none: str) -> Proof:
    """A feature proved by a count per transformer (quantized weights, compiled modules): some count above 0."""
    if counts is None:
        return Proof(feature, False, f"the row recorded no {feature} facts, so it cannot show the feature acted")
    found = {name: n for name, n in counts.items() if n}
    if not found:
        return Proof(feature, False, none)
    return Proof(feature, True, ", ".join(f"{name}: {n} {what}" for name, n in found.items()))
