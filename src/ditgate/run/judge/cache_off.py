"""The cache row checks the adapter itself: the same BlockAdapter and patch functors with caching off.

A cache row's output can pass its (loose) gate while the adapter changes the model: a PatchFunctor that gives
every block the wrong mask passed at cosine 0.9997. So every single-process cache row gets a reference row
`NAME-cache-off`: its cache configuration with a mask that computes every step (adapter and functors applied,
nothing cached). Its final latents must match the baseline's by the tensor rule (`rules.tensor` of gates.json) in
float32, and exactly in reduced precision, where an adapter that changes no arithmetic measured max-abs 0 in bf16
and a mask-dropping patch 0.037. A cache row whose cache-off twin departs fails, naming the adapter.
"""

from __future__ import annotations

from typing import Any

from ditgate.run.define.rows import CACHE_OFF_SUFFIX, Row

SUFFIX = CACHE_OFF_SUFFIX


def twin(row: Row, steps: int | None) -> Row | None:
    """The caching-off twin of a gated single-process cache row; None when it has none (or the steps are unknown)."""
    if row.phase != "cache" or row.cache is None or row.world_size != 1 or not steps or row.variant:
        return None  # a variant (another prompt or seed) leaves the structural check to its row
    return Row(row.name + SUFFIX, baseline=None, cache=dict(row.cache) | {"mask": [1] * int(steps)},
               compile=row.compile, quantize=row.quantize,
               description=f"{row.name} with caching off: its adapter and functors applied, every step computed")


def judge(state, base_name: str, twin_state, load, dtype: str, gates: dict | None) -> None:
    """Fail the cache row `state` when its caching-off twin's latents depart from the baseline's."""
    from ditgate.gates.verdicts import load_gates
    from ditgate.metrics import tensor_metrics

    if twin_state is None or state.verdict is None:
        return
    if not twin_state.ran:
        state.verdict |= {"cache_off": {"passed": False, "detail": "the caching-off check did not run"}}
        state.verdict["passed"] = False
        state.reasons.append("the caching-off check (adapter applied, nothing cached) did not run")
        return
    base, off = load(base_name, "latents"), load(twin_state.row.name, "latents")
    if base is None or off is None:
        found: dict[str, Any] = {"passed": False, "detail": "no final latents to compare caching off with"}
    else:
        tensor = (gates or load_gates())["rules"]["tensor"]
        limit = next(c["value"] for c in tensor["checks"] if c["metric"] == "max_abs") \
            if dtype in tensor["dtypes"] else 0.0
        max_abs = float(tensor_metrics(base, off)["max_abs"])
        found = {"passed": max_abs <= limit, "max_abs": max_abs, "limit": limit,
                 "detail": f"caching off, the adapter's latents differ from the baseline's by max-abs {max_abs:.3g} "
                           f"(allowed {limit:g} in {dtype})"}
    state.verdict |= {"cache_off": found}
    if not found["passed"]:
        state.verdict["passed"] = False
        functor = ((twin_state.result or {}).get("facts") or {}).get("patch_functor")
        culprit = f"the patch functor {functor} or the BlockAdapter" if functor else "the BlockAdapter or a patch functor"
        state.reasons.append(found["detail"] + f": {culprit} changes the model (check what "
                             f"{'it' if functor else 'each functor'} patches, the ForwardPattern and the block lists)")
