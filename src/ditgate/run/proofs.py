"""Checks that a row's feature really acted, from the facts its probes recorded.

A parallel output equal to the baseline proves nothing if nothing was split; a cached output proves nothing if no
step was cached. Each check compares the row's facts with those of the row it is compared with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ditgate.run.rows import Row


@dataclass(frozen=True)
class Proof:
    feature: str
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cache(facts: dict[str, Any]) -> Proof:
    stats = facts.get("cache") or []
    cached = sorted({s for entry in stats for s in entry.get("cached_steps", [])})
    calls, transformer_calls = facts.get("last_block_calls", {}), facts.get("transformer_calls", 0)
    skipped = {k: transformer_calls - v for k, v in calls.items() if v < transformer_calls}
    if not cached:
        diffs = [round(v, 4) for entry in stats for v in entry.get("residual_diffs", {}).values()]
        return Proof("cache", False, "cache-dit cached no step (summary: cached_steps empty); residual diffs "
                     f"{diffs[:8]} never fell under the threshold, or the warm-up covered every step")
    if not skipped:
        return Proof("cache", False, f"summary reports cached steps {cached}, but the last block of every block list"
                     f" ran on all {transformer_calls} transformer calls: no block was skipped")
    return Proof("cache", True, f"cached steps {cached}; last-block calls skipped: "
                 + ", ".join(f"{k.split('.', 1)[-1]} {n} of {transformer_calls}" for k, n in skipped.items()))


def _cp(row: Row, facts: dict[str, Any], base: dict[str, Any], base_row: Row) -> Proof:
    got, ref = facts.get("block_seq_len", {}), base.get("block_seq_len", {})
    keys = [k for k in ref if k in got]
    if not keys:
        return Proof("cp", False, "no block input was observed, so the sequence split cannot be checked")
    bad = []
    for key in keys:
        expected = ref[key] * base_row.cp_size / row.cp_size
        if got[key] != expected:
            bad.append(f"{key.split('.', 1)[-1]}: {got[key]} tokens per rank, expected {expected:g} "
                       f"({ref[key]} / {row.cp_size})")
    if bad:
        return Proof("cp", False, "the sequence entering the blocks was not divided: " + "; ".join(bad))
    key = keys[0]
    return Proof("cp", True, f"{ref[key]} tokens split into {got[key]} per rank ({row.cp_size} ranks)")


def _sharded(feature: str, facts: dict[str, Any], components: list[str]) -> Proof:
    sharded = facts.get("sharded") or {}
    found = {name: sharded[name] for name in components if name in sharded}
    total = sum(v["sharded"] for v in found.values())
    wrong = [w for v in found.values() for w in v["wrong_size"]]
    if total == 0:
        return Proof(feature, False, f"no weight of {', '.join(components) or 'the component'} is a sharded DTensor")
    if wrong:
        return Proof(feature, False, f"shards of the wrong size: {', '.join(wrong[:5])}")
    return Proof(feature, True, ", ".join(f"{name}: {v['sharded']} weights sharded" for name, v in found.items()
                                          if v["sharded"]))


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
    if row.cache:
        proofs.append(_cache(facts))
    if row.cp_size > 1:
        proofs.append(_cp(row, facts, base_facts, base_row))
    if row.tp_size > 1:
        proofs.append(_sharded("tp", facts, [k for k in (facts.get("sharded") or {}) if k.startswith("transformer")]))
    if parallel.get("text_encoder"):
        proofs.append(_sharded("tep", facts, [k for k in (facts.get("sharded") or {}) if k.startswith("text_encoder")]))
    if parallel.get("vae"):
        proofs.append(_vae(facts, base_facts))
    return proofs
