"""Block lists, as observed: each block's signature and outputs, the ForwardPattern that matches them, what the forward does around and between the lists."""

from __future__ import annotations

from ditgate.inspect.model import E, H, OTHER, SKIP_FINDING, source_file

import inspect
from ditgate.inspect.observe import Probe, as_outputs, block_lists, match_flows, tensor_summary
from ditgate.inspect.model import BlockList, Param


# -- block lists and ForwardPatterns ------------------------------------------------------------------------------
def _signature(forward) -> list[Param]:
    return [Param(p.name, p.kind.name.lower(), p.default is not inspect.Parameter.empty)
            for p in inspect.signature(forward).parameters.values()]


def _positional(params: list[Param]) -> list[str]:
    return [p.name for p in params if p.kind in ("positional_only", "positional_or_keyword")]


def _cosine(a, b) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    return float((a @ b) / (a.norm() * b.norm() + 1e-30))


def output_roles(record, params: list[Param]) -> tuple[list[str] | None, str | None, str | None]:
    """Roles of block 0's outputs, the evidence used, and the input whose update is returned (if any)."""
    import torch

    outputs = as_outputs(record.first_outputs)
    if outputs is None:
        return None, None, None
    first = _positional(params)[:1]
    h_param = first[0] if first else None
    bound = record.first_call.bound
    roles: list[str | None] = [None] * len(outputs)
    encoder_param, evidence = None, None
    if record.transitions and record.transitions[0].index == record.order[0] + 1:
        for position, (param, _) in record.transitions[0].flows.items():
            roles[position] = H if param == h_param else E
            if param != h_param:
                encoder_param = param
            evidence = "flow"
    for position, out in enumerate(outputs):
        if roles[position] is not None:
            continue
        if not isinstance(out, torch.Tensor):
            roles[position] = OTHER
            continue
        same_shape = [p for p, v in bound.items() if isinstance(v, torch.Tensor) and v.shape == out.shape]
        taken = {encoder_param} if encoder_param else set()
        if H in roles:
            taken.add(h_param)
        candidates = [p for p in same_shape if p not in taken]
        if len(candidates) == 1:
            param = candidates[0]
            evidence = evidence or "shape"
        elif candidates:
            param = max(candidates, key=lambda p: _cosine(out, bound[p]))
            evidence = "similarity"
        else:
            roles[position] = OTHER
            continue
        roles[position] = H if param == h_param else E
        if param != h_param:
            encoder_param = param
    return [r or OTHER for r in roles], evidence, encoder_param


def _rebinds(pattern, params: list[Param], call_positional: int, call_keywords: list[str],
             block_forward) -> str | None:
    """None when cache-dit's cached blocks would pass this call on to the block unchanged; else why not.

    cache-dit's cached blocks are called like the block was, bind the call to
    `forward(hidden_states, encoder_hidden_states, *args, **kwargs)` (Pattern_0..2) or
    `forward(hidden_states, *args, **kwargs)` (Pattern_3..5), then call every block as
    `block(hidden_states[, encoder_hidden_states], *args, **kwargs)`.
    """
    P = inspect.Parameter
    names = ["hidden_states"] + ([] if pattern.Forward_H_only else ["encoder_hidden_states"])
    cached = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names] +
                               [P("args", P.VAR_POSITIONAL), P("kwargs", P.VAR_KEYWORD)])
    positional = _positional(params)[:call_positional]
    tokens_args = tuple(positional)
    tokens_kwargs = {k: k for k in call_keywords}
    try:
        outer = cached.bind(*tokens_args, **tokens_kwargs)
    except TypeError as exc:
        return f"the cached blocks cannot take the loop's call ({exc})"
    passed = [outer.arguments[n] for n in names] + list(outer.arguments.get("args", ()))
    passed_kwargs = dict(outer.arguments.get("kwargs", {}))
    try:
        inner = inspect.signature(block_forward).bind(*passed, **passed_kwargs)
    except TypeError as exc:
        return f"the block cannot take the call the cached blocks make ({exc})"
    for param, token in inner.arguments.items():
        if isinstance(token, dict):
            if any(k != v for k, v in token.items()):
                return "keyword arguments would reach the wrong parameters"
        elif isinstance(token, tuple):
            return "the block takes *args; positional arguments would be reinterpreted"
        elif param != token:
            return f"parameter {param!r} would receive the loop's {token!r}"
    return None


def choose_pattern(block: BlockList, params: list[Param], call_positional: int, call_keywords: list[str],
                   block_forward) -> None:
    """Fill `pattern`, `pattern_reason`, `check_forward_pattern`, `patch_functor_needed` of `block`."""
    from cache_dit.caching.forward_pattern import ForwardPattern

    roles = tuple(block.outputs or ())
    positional = _positional(params)
    names = {p.name for p in params}
    if roles == (H,):
        second = positional[1] if len(positional) > 1 else None
        takes_e = second == E and E in (block.call or {}).get("inputs", {}) \
            and str(block.call["inputs"][E]).startswith("tensor")
        candidates = ["Pattern_2", "Pattern_3"] if takes_e else ["Pattern_3", "Pattern_2"]
    elif roles in ((H, E), (E, H)):
        first_h = roles == (H, E)
        if block.encoder_param is not None:
            candidates = ["Pattern_0" if first_h else "Pattern_1"]
            if len(positional) < 2 or positional[1] != block.encoder_param:
                block.pattern_reason = (f"the block returns an updated {block.encoder_param!r}, but it is not the "
                                        f"block's second parameter; a PatchFunctor must reorder the signature")
                block.patch_functor_needed = True
        else:
            candidates = ["Pattern_4" if first_h else "Pattern_5"]
    else:
        block.pattern = None
        block.patch_functor_needed = True
        block.pattern_reason = (f"the block returns {list(roles) or 'something that is not a tensor or tuple'}; "
                                "every ForwardPattern returns hidden_states (and encoder_hidden_states) only, so a "
                                "PatchFunctor or a wrapper must adapt the return value")
        return
    failures = []
    for name in candidates:
        pattern = ForwardPattern[name]
        problem = _rebinds(pattern, params, call_positional, call_keywords, block_forward)
        if problem is None:
            block.pattern = name
            block.pattern_reason = block.pattern_reason or _describe(pattern, roles, block)
            break
        failures.append(f"{name}: {problem}")
    else:
        block.pattern = candidates[0]
        block.patch_functor_needed = True
        block.pattern_reason = ("the outputs match " + candidates[0] + ", but the loop calls the block in a way the "
                                "cached blocks cannot forward (" + "; ".join(failures) + "): a PatchFunctor must "
                                "make the loop pass hidden_states (and encoder_hidden_states) first")
        streams = list(ForwardPattern[block.pattern].In)  # what the cached list passes first, by position
        if set(streams) <= set(call_keywords) & names:  # the loop names them: a wrapper can pass them by name
            block.call_form = streams
    missing = [n for n in ForwardPattern[block.pattern].In if n not in names]
    block.check_forward_pattern = not missing
    if missing:
        first = positional[0] if positional else None
        block.pattern_reason += (f"; the signature lacks {missing} (its first input is {first!r}), so cache-dit's "
                                 "static check fails: set check_forward_pattern=False")


def _describe(pattern, roles: tuple, block: BlockList) -> str:
    inputs = "(hidden_states)" if pattern.Forward_H_only else "(hidden_states, encoder_hidden_states)"
    out = "(" + ", ".join("H" if r == H else "E" for r in roles) + ")"
    return f"{pattern.name}: takes {inputs}, returns {out}, observed (evidence: {block.role_evidence})"


def audit_loop(block: BlockList, record, h_param: str | None) -> None:
    """Extra work between block calls: changed hidden states, per-block arguments, skipped or repeated blocks."""
    expected = list(range(block.length))
    if record.order != expected:
        block.loop_findings.append(f"blocks were called in the order {record.order[:12]}"
                                   f"{'...' if len(record.order) > 12 else ''}, not 0..{block.length - 1} once each")
    roles = block.outputs or []
    targets = {H: h_param, E: block.encoder_param}
    for transition in record.transitions:
        for position, role in enumerate(roles):
            want = targets.get(role)
            if want is None:
                continue
            got = transition.flows.get(position)
            if got is None or got[0] != want:
                block.stream_changed_between = True
                block.loop_findings.append(
                    f"{role} changes between block {transition.index - 1} and block {transition.index}: the loop "
                    "does work between block calls, which a cached block list would skip")
                break
        changed = [a for a in transition.changed_args if a not in targets.values()]
        if transition.from_outputs:  # a long skip inside the loop: the argument is an earlier block's output
            for name, (source, position) in transition.sources.items():
                block.skip_sources.setdefault(name, {})[transition.index] = [source, position]
            block.loop_findings.append(f"block {transition.index} gets {transition.from_outputs} = an earlier "
                                       f"block's output {SKIP_FINDING}, which a cached block list would not hand on")
            changed = [a for a in changed if a not in transition.from_outputs]
        if changed:
            block.per_block_arguments += [a for a in changed if a not in block.per_block_arguments]
            block.loop_findings.append(f"block {transition.index} gets different {changed} than block 0: "
                                       "per-block arguments are not supported by the cached block list")
    block.loop_findings = list(dict.fromkeys(block.loop_findings))[:6]
    if block.loop_findings:
        block.patch_functor_needed = True


def analyse_block_list(transformer_name: str, attribute: str, blocks, record,
                       interleaved: bool = False) -> BlockList:
    block0 = blocks[0]
    params = _signature(block0.forward)
    returns = inspect.signature(block0.forward).return_annotation
    info = BlockList(
        transformer=transformer_name, attribute=attribute, length=len(blocks), block_class=type(block0).__name__,
        block_module=type(block0).__module__, source_file=source_file(block0), signature=params,
        returns="" if returns is inspect.Signature.empty else str(returns))
    if record is None or record.first_call is None:
        info.pattern_reason = "not called during the run, so its outputs were not observed"
        return info
    info.called = True
    call = record.first_call
    positional = _positional(params)
    info.call = {"positional": positional[:call.positional], "keyword": call.keywords,
                 "inputs": {k: tensor_summary(v) for k, v in call.bound.items()}}
    roles, evidence, encoder_param = output_roles(record, params)
    info.outputs, info.role_evidence, info.encoder_param = roles, evidence, encoder_param
    info.output_shapes = [tensor_summary(o) for o in (as_outputs(record.first_outputs) or [record.first_outputs])]
    if roles is not None:
        choose_pattern(info, params, call.positional, call.keywords, block0.forward)
    else:
        info.patch_functor_needed = True
        info.pattern_reason = (f"the block returns {type(record.first_outputs).__name__}, not a tensor or a tuple; "
                               "no ForwardPattern applies")
    if positional and positional[0] != H and info.check_forward_pattern is not False:
        info.pattern_reason += (f"; the first input is named {positional[0]!r}, not 'hidden_states': "
                                "check_forward_pattern must be False")
        info.check_forward_pattern = False
    audit_loop(info, record, positional[0] if positional else None)
    # a list whose blocks never get the previous block's output is no loop, unless another list's blocks run between
    # its blocks (interleaved lists: a factorized DiT's spatial block i+1 gets temporal block i's output, rearranged)
    if record.transitions and not interleaved and not any(t.flows or t.carried for t in record.transitions):
        info.chained, info.pattern, info.patch_functor_needed, info.loop_findings = False, None, False, []
        info.pattern_reason = ("its blocks do not chain: no block was handed the previous block's output or a part "
                               "of it (observed at every block), each runs on an input of its own: no loop a cached "
                               "block list stands for")
    return info


def between_lists(transformer_name: str, record) -> list[str]:
    """What happens to hidden states between consecutive block lists (in call order)."""
    order = []
    for event in record.events:
        name = event.rsplit(".", 1)[0]
        if name in record.lists and name not in order:
            order.append(name)
    findings = []
    for a, b in zip(order, order[1:]):
        previous, first = record.lists[a]._previous, record.lists[b].first_call
        flows = match_flows(previous, first.bound) if first else {}
        tensors = [i for i, v in enumerate(previous or ()) if hasattr(v, "shape")]
        if tensors and all(i in flows for i in tensors):
            findings.append(f"{transformer_name}: {a} -> {b}: outputs pass on unchanged "
                            f"({', '.join(f'{flows[i][0]}' for i in tensors)})")
        else:
            findings.append(f"{transformer_name}: {a} -> {b}: the hidden states change between the lists "
                            "(e.g. a concatenation); a cached adapter covering both lists must reproduce it")
        start = record.events.index(f"{b}.0") if f"{b}.0" in record.events else None
        end = max((i for i, e in enumerate(record.events) if e.startswith(a + ".")), default=None)
        if start is not None and end is not None and record.events[end + 1:start]:
            findings.append(f"{transformer_name}: between {a} and {b} the transformer calls "
                            f"{record.events[end + 1:start]}")
    return findings


def _inside(record, name: str) -> list[str]:
    """The events (calls) of the transformer from the first to the last block of list `name`."""
    positions = [i for i, e in enumerate(record.events) if e.startswith(name + ".")]
    return record.events[positions[0]:positions[-1] + 1] if positions else []


def calls_inside_loop(record, name: str) -> list[str]:
    """Direct children of the transformer called between the first and the last block of list `name`."""
    return sorted({e for e in _inside(record, name) if e.rsplit(".", 1)[0] not in record.lists})


def _interleaved(record, name: str) -> bool:
    """Blocks of another list run between the first and the last block of list `name`."""
    return any(e.rsplit(".", 1)[0] in record.lists and not e.startswith(name + ".") for e in _inside(record, name))


def _analyse_lists(name: str, transformer, record) -> tuple[list[BlockList], list[str]]:
    lists = [analyse_block_list(name, attribute, blocks, record.lists.get(attribute) if record else None,
                                interleaved=bool(record) and _interleaved(record, attribute))
             for attribute, blocks in block_lists(transformer).items()]
    if record is None:
        return lists, []
    for block in lists:
        inside = calls_inside_loop(record, block.attribute)
        if inside:
            block.loop_findings.append(f"the loop also calls {inside} between blocks; a cached block list would "
                                       "skip that work")
            block.patch_functor_needed = True
    return lists, between_lists(name, record)


def observe_transformer(transformer, run, name: str = "transformer") -> tuple[list[BlockList], list[str], int]:
    """Block lists of a bare transformer, observed while `run()` calls it (e.g. a forward with dummy inputs).

    Returns the block lists, the findings between lists, and how often the transformer was called. When `run`
    raises, the exception propagates; `static_block_lists` gives what can be read without a call.
    """
    import torch

    probe = Probe({name: transformer})
    with torch.no_grad(), probe:
        run()
    record = probe.transformers[name]
    lists, between = _analyse_lists(name, transformer, record)
    return lists, between, record.calls


def static_block_lists(transformer, name: str = "transformer") -> list[BlockList]:
    """Block lists and block signatures only (nothing observed)."""
    return _analyse_lists(name, transformer, None)[0]
