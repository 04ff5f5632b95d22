"""The block-loop PatchFunctor of a scaffolded plugin: `FUNCTOR`, the source of `BlockLoop` pasted into the plugin
as it is, and its arguments (`_functor`; `outside` from write.py's `_outside`) from what the loop was seen doing
around its block calls: per-block arguments, a block's sub-module read outside the loop, skips inside the loop (a
block handed an earlier block's output), and a stream the loop cuts or joins between block calls (`between`). What
it does not cover is named NOT HANDLED."""

from __future__ import annotations

from ditgate.inspect.model import SKIP_FINDING  # audit_loop's mark on a finding that `skips` handles


FUNCTOR = '''
# -- a patch functor written by `ditgate scaffold` (used by block_adapter) ----------------------------------------
def _signature(block):
    """The parameters of the block class's own forward (hooks may have wrapped the instance's)."""
    return inspect.signature(type(block).forward.__get__(block))


class _Recorder(torch.nn.Module):
    """Stands in for one block while the forward runs to record what the loop hands each block: keeps the arguments
    it is given and returns its stream inputs unchanged, in the order the block returns them (under a `_Trace` or
    with `seen`: as values of their own, block `place`'s outputs, whose later uses the trace follows or `seen` keeps
    with the arguments); raises `_Done` once `stop()` holds (the rest of the forward, under CP, would gather a
    sequence the stand-ins never split)."""

    def __init__(self, signature, kept, returns, trace=None, place=None, seen=None, stop=None):
        super().__init__()
        self.signature, self.kept, self.returns, self.trace, self.place, self.seen, self.stop = \
            signature, kept, returns, trace, place, seen, stop

    def forward(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs).arguments
        self.kept.append(bound)
        out = tuple(bound[name] for name in self.returns)
        if self.trace is not None:
            self.trace.inputs[self.place] = {n: (self.trace.origin.get(id(bound[n]), (None, None)), bound[n])
                                             for n in self.returns}
            self.trace.paused = True
            out = tuple(x.view_as(x) for x in out)
            self.trace.paused = False
            for position, x in enumerate(out):
                self.trace.mark(x, self.place, ("out", position, None))
        elif self.seen is not None:
            out = tuple(x.view_as(x) for x in out)
        if self.seen is not None:
            self.seen[self.place[1]] = (bound, out)
        if self.stop is not None and self.stop():
            raise _Done
        return out if len(out) > 1 else out[0]


class _Done(Exception):  # noqa: N818 - the stand-in pass has what it needs
    """The stand-in pass has what it needs."""


class _Ref:
    def __init__(self, ref):
        self.ref = ref


class _Trace(torch.overrides.TorchFunctionMode):
    """While stand-in blocks run the forward: the tensor operations the forward applies to what each block returns
    (`programs[(list, block)]`: function and arguments, `_Ref`s for the values derived from those outputs), and
    where each stand-in's stream inputs came from (`inputs[(list, block)]`), so that a block can redo the loop's work
    on the previous block's outputs itself (`replay`)."""

    def __init__(self):
        super().__init__()
        self.origin, self.programs, self.inputs, self.keep, self.paused = {}, {}, {}, [], False

    def mark(self, tensor, source, ref):
        self.origin[id(tensor)] = (source, ref)
        self.keep.append(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        sources = set()

        def ref(x):
            if torch.is_tensor(x) and id(x) in self.origin:
                sources.add(self.origin[id(x)][0])
                return _Ref(self.origin[id(x)][1])
            return x

        recorded = torch.utils._pytree.tree_map(ref, (args, kwargs or {}))
        leaves = [(None, out)] if torch.is_tensor(out) else \
            [(i, x) for i, x in enumerate(out) if torch.is_tensor(x)] if isinstance(out, (tuple, list)) else []
        if sources and leaves:
            source = sources.pop() if len(sources) == 1 else None  # None: made from more than one block's outputs
            program = self.programs.setdefault(source, [])
            program.append((func, *recorded))
            for item, x in leaves:
                self.mark(x, source, ("op", len(program) - 1, item))
        return out

    def replay(self, ref, outs, memo, source):
        kind, step, item = ref
        if kind == "out":
            return outs[step]
        if step not in memo:
            func, args, kwargs = self.programs[source][step]
            args, kwargs = torch.utils._pytree.tree_map(
                lambda x: self.replay(x.ref, outs, memo, source) if isinstance(x, _Ref) else x, (args, kwargs))
            memo[step] = func(*args, **kwargs)
        return memo[step] if item is None else memo[step][item]


class BlockLoop(cache_dit.PatchFunctor):
    """What the block loop does that cache-dit's cached block list does not (the list holds one wrapper during a
    call, which calls every block with the values the loop computed for the first):
    `lists` {list: (argument names, the stream inputs the block returns, in order)}: the loop hands each block its
    own value of those arguments. On each call of the transformer the forward first runs with stand-in blocks that
    only record what the loop hands each block (no block runs), then runs for real, each block given the values
    recorded for it. Right while those values do not depend on what the blocks return (they were observed to differ
    from block to block, not to follow the stream); the cache row's caching-off check tells.
    `outside` {list: [(index, attribute)]}: the forward reads a block's sub-module outside the loop (DiT's
    `transformer_blocks[0].norm1.emb`); during a call the wrapper in that place is given the block's sub-module.
    `skips` {list: (arguments, the stream inputs the block returns, in order)}: the loop hands a block an earlier
    block's output in those arguments (HunyuanDiT's U-shaped skip stack); each call runs the loop with stand-in blocks
    to find which block takes which earlier output on this transformer, whatever its depth, then keeps those outputs
    as the blocks run and hands each later block its own, whoever calls the blocks.
    `between` {list: the stream inputs the block returns, in order}: the loop changes the stream between block calls
    (cuts, joins, projects it); while cache-dit's cached list stands for the blocks, each call first runs the forward
    with stand-in blocks under a `_Trace`, which records what the loop does to each block's outputs before the next
    block gets them, and each block redoes that work itself on the previous block's outputs (the first block of a
    later list on the outputs the loop got from the earlier list). Right while that work does not depend on the
    values the blocks return (the caching-off check tells).
    `calls` {list: stream inputs}: cache-dit's cached list passes these first by position, which the block takes
    elsewhere (HiDream's `hidden_states_masks` second); each block takes them by position and passes them by name."""

    def __init__(self, lists, outside=None, skips=None, between=None, calls=None):
        self.lists, self.outside, self.skips, self.between = lists, outside or {}, skips or {}, between or {}
        self.calls = calls or {}

    @classmethod
    def is_from_diffusers(cls, transformer):
        return True  # written for this model, wherever its class is defined

    def _apply(self, transformer, **kwargs):
        if getattr(transformer, "_is_patched", False):
            return transformer
        recorded = {name: [] for name in self.lists}
        originals = {name: getattr(transformer, name) for name in {*self.lists, *self.outside, *self.skips,
                                                                      *self.between}}
        returns = {**{name: r for name, (_, r) in {**self.skips, **self.lists}.items()}, **self.between}
        traces = dict.fromkeys(self.between)  # this call's trace of each list a cached list stands for, else None
        finals = {}  # this call's outputs of each such list (what the loop got from the cached list)
        for name, outputs in self.between.items():
            for index, block in enumerate(originals[name]):
                block.forward = self._between(block, index, name, outputs, traces, finals,
                                              {n: len(originals[n]) for n in self.between})
        for name, (arguments, _) in self.lists.items():
            for index, block in enumerate(originals[name]):
                block.forward = self._own(block, recorded[name], index, arguments)
        kept = {name: {} for name in self.skips}  # this call's outputs of the blocks a later block takes
        pairs = {name: {} for name in self.skips}  # this call's {block: {argument: (earlier block, position)}}
        seen = {name: {} for name in self.skips}  # the stand-in pass: {block: (its arguments, its outputs)}
        for name in self.skips:
            for index, block in enumerate(originals[name]):
                block.forward = self._skip(block, kept[name], index, pairs[name])
        for name, streams in self.calls.items():  # outermost: the cached list's call, by name, for the others
            for block in getattr(transformer, name):
                block.forward = self._by_name(block.forward, streams)
        forward = transformer.forward

        @functools.wraps(forward)
        def patched(*args, **kwargs):
            for outputs in (*kept.values(), *pairs.values(), *seen.values()):
                outputs.clear()
            for name, reads in self.outside.items():
                current = getattr(transformer, name)
                for index, attribute in reads:
                    if current is not originals[name] and index < len(current):
                        object.__setattr__(current[index], attribute, getattr(originals[name][index], attribute))
            replaced = [name for name in self.between if getattr(transformer, name) is not originals[name]]
            stand = [*self.lists, *(name for name in [*replaced, *self.skips] if name not in self.lists)]
            traces.update(dict.fromkeys(traces))
            if not stand:
                return forward(*args, **kwargs)
            saved = {name: getattr(transformer, name) for name in stand}
            trace = _Trace() if replaced else contextlib.nullcontext()
            ends = {n: len(originals[n]) - 1 for n in self.skips}  # only skips need the pass: it ends at their ends
            stop = None if self.lists or replaced else lambda: all(ends[n] in seen[n] for n in ends)
            for name in stand:
                recorded.setdefault(name, []).clear()
                signature = _signature(originals[name][0])
                follow = trace if name in replaced else None
                setattr(transformer, name, torch.nn.ModuleList(
                    _Recorder(signature, recorded[name], returns[name], follow, (name, i), seen.get(name), stop)
                    for i in range(len(originals[name]))))
            try:
                with trace:
                    forward(*args, **kwargs)
            except _Done:
                pass
            finally:
                for name, blocks in saved.items():
                    setattr(transformer, name, blocks)
            for name, (arguments, _) in self.skips.items():
                self._pairs(seen[name], arguments, pairs[name])
                seen[name].clear()
            traces.update({name: trace for name in replaced})
            finals.clear()
            handles = [wrapper.register_forward_hook(functools.partial(self._final, finals, name))
                       for name in replaced for wrapper in getattr(transformer, name)]
            try:
                return forward(*args, **kwargs)
            finally:
                traces.update(dict.fromkeys(traces))
                for handle in handles:
                    handle.remove()

        transformer.forward = patched
        transformer._is_patched = True
        return transformer

    @staticmethod
    def _own(block, recorded, index, arguments):
        signature, forward = _signature(block), block.forward

        @functools.wraps(forward)
        def own(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            if index < len(recorded):
                bound.arguments.update({n: recorded[index][n] for n in arguments if n in recorded[index]})
            return forward(*bound.args, **bound.kwargs)

        return own

    @staticmethod
    def _by_name(forward, streams):
        @functools.wraps(forward)
        def by_name(*args, **kwargs):
            return forward(*args[len(streams):], **dict(zip(streams, args)), **kwargs)

        return by_name

    @staticmethod
    def _final(finals, name, module, args, output):
        finals[name] = tuple(output) if isinstance(output, (tuple, list)) else (output,)

    @staticmethod
    def _between(block, index, name, returns, traces, finals, lengths):
        signature, forward = _signature(block), block.forward

        @functools.wraps(forward)
        def between(*args, **kwargs):
            trace = traces[name]
            if trace is None:  # the loop's own blocks: the loop made each block's inputs itself
                return forward(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            handed, memo = tuple(bound.arguments.get(n) for n in returns), {}
            for param, ((source, ref), value) in trace.inputs[(name, index)].items():
                if source is None and ref is None:  # not made from a block's output: the value the loop made
                    bound.arguments[param] = value
                elif source == (name, index - 1):  # from the previous block's outputs, as the cached list hands them
                    bound.arguments[param] = trace.replay(ref, handed, memo.setdefault(source, {}), source)
                elif source is not None and source[0] in finals and source[1] == lengths.get(source[0], 0) - 1:
                    # from another list's last block: that list's outputs as the loop got them in this call
                    outs = finals[source[0]]
                    bound.arguments[param] = trace.replay(ref, outs, memo.setdefault(source, {}), source)
                else:
                    raise RuntimeError(f"`{name}` block {index}'s `{param}` is made from {source or 'several blocks'}"
                                       "' outputs: BlockLoop moves only work on the previous block's outputs into "
                                       "a block")
            return forward(*bound.args, **bound.kwargs)

        return between

    @staticmethod
    def _pairs(seen, arguments, pairs):
        """Which earlier block's output (at which position) each block got in `arguments` in the stand-in pass."""
        made = {id(x): (i, p) for i, (_, outs) in seen.items() for p, x in enumerate(outs)}
        for index, (bound, _) in seen.items():
            takes = {a: made[id(bound[a])] for a in arguments
                     if torch.is_tensor(bound.get(a)) and made.get(id(bound[a]), (index,))[0] < index}
            if takes:
                pairs[index] = takes

    @staticmethod
    def _skip(block, kept, index, pairs):
        signature, forward = _signature(block), block.forward

        @functools.wraps(forward)
        def skip(*args, **kwargs):
            takes = pairs.get(index, {})
            source = any(earlier == index for found in pairs.values() for earlier, _ in found.values())
            bound = signature.bind(*args, **kwargs)
            for argument, (earlier, position) in takes.items():
                if earlier not in kept:
                    raise RuntimeError(f"block {index} takes block {earlier}'s output as `{argument}`, and block "
                                       f"{earlier} did not run in this call (a cache that skips it computed block "
                                       f"{index}): compute both or neither")
                bound.arguments[argument] = kept[earlier][position]
            out = forward(*bound.args, **bound.kwargs)
            if source:
                kept[index] = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            return out

        return skip
'''


def _skips(b) -> tuple[tuple[list[str], list[str]] | None, str]:
    """`BlockLoop`'s `skips` entry of list `b` (the arguments that carry an earlier block's output, the stream inputs
    the block returns) and its note; None where what the block returns does not map onto its inputs."""
    pairs = "; ".join(f"`{a}`: " + ", ".join(f"block {j} <- block {src[0]}" for j, src in sorted(r.items()))
                      for a, r in b.skip_sources.items())
    seen = f"the loop hands later blocks an earlier block's output (observed, the same tensor: {pairs})"
    if None in _returns(b):
        return None, f"NOT HANDLED: `{b.attribute}`: {seen}, and its outputs ({b.outputs}) do not map onto its inputs"
    return (sorted(b.skip_sources), _returns(b)), (
        f"`{b.attribute}`: {seen}, a skip stack inside the loop; cache-dit's cached block list calls every block with "
        "the first one's arguments, so BlockLoop finds each call which block takes which earlier block's output (a "
        "stand-in pass: the pairs follow the depth of the transformer it runs on), keeps those outputs as they run "
        "and hands each later block its own (without it the cache row errors or departs: the later blocks get no skip)")


def _functor(lists: list, outside: dict[str, list] | None = None) -> tuple[str | None, list[str]]:
    """The PatchFunctor the block loop needs, from what it was seen doing between block calls: per-block arguments
    (each block handed its own value, not the previous block's output) are recorded per call and handed back to
    each block, an earlier block's output handed to a later block (a skip inside the loop) is kept per call and
    handed on, and the work the loop does on the stream between blocks is traced per call and redone by each block
    (`BlockLoop`); that work next to skips, per-block arguments or a reordered loop is named NOT HANDLED (the fix is
    the model's own loop moved into a functor by hand)."""
    entries, skips, between, calls, notes = [], {}, {}, {}, []
    for b in lists:
        if b.call_form:
            calls[b.attribute] = b.call_form
            notes.append(f"`{b.attribute}`: cache-dit's cached block list passes {b.call_form} first by position, "
                         "which the block takes elsewhere, and the loop passes them by name (observed): BlockLoop "
                         "passes them on by name (without it the cache row errors: multiple values for an argument)")
        work = [f for f in b.loop_findings if "changes between block" in f or "also calls" in f]
        if b.stream_changed_between and len(work) == len(b.loop_findings) and None not in _returns(b) \
                and not b.skip_sources and not b.per_block_arguments:
            between[b.attribute] = _returns(b)
            notes.append(f"`{b.attribute}`: {'; '.join(work)} (observed); cache-dit's cached block list hands each "
                         "block the previous block's outputs as they are: BlockLoop follows what the loop does to "
                         "each block's outputs before the next block gets them (a stand-in pass per call) and has "
                         "each block but the first redo it (without it the cache row errors or departs)")
            continue
        if b.stream_changed_between or work:
            notes.append(f"NOT HANDLED: `{b.attribute}`: {'; '.join(b.loop_findings)}; write a PatchFunctor that "
                         "moves that work into the blocks (cache-dit's HunyuanDiT and ControlNet functors do)")
            continue
        if b.skip_sources:
            entry, note = _skips(b)
            skips.update({b.attribute: entry} if entry else {})
            notes.append(note)
        if not b.per_block_arguments:
            left = [f for f in b.loop_findings if SKIP_FINDING not in f]
            pattern_left = "PatchFunctor" in b.pattern_reason and not b.call_form
            if b.patch_functor_needed and (left or pattern_left or not b.skip_sources and not b.call_form):
                notes.append(f"NOT HANDLED: `{b.attribute}` needs a PatchFunctor the scaffold does not write: "
                             f"{'; '.join(left) or b.pattern_reason}")
            continue
        returns = _returns(b)
        if None in returns:
            notes.append(f"NOT HANDLED: `{b.attribute}` gets per-block {b.per_block_arguments}, and what it returns "
                         f"({b.outputs}) does not map onto its inputs")
            continue
        entries.append(f'"{b.attribute}": ({b.per_block_arguments!r}, {returns!r})')
        notes.append(f"`{b.attribute}`: block 1 was handed other {b.per_block_arguments} than block 0 (observed), "
                     "while its stream inputs are the previous block's outputs; cache-dit's cached block list "
                     "would hand every block the first one's: BlockLoop records each block's own per call "
                     "and hands it back; without it the cache row's caching-off check departs from the baseline")
    others = [b for b in lists if between and b.attribute not in between and not b.loop_findings
              and None not in _returns(b)]
    for b in others:  # stood in for too while the loop's work is traced, whose outputs a later list's work may read
        between[b.attribute] = _returns(b)
    if others:
        notes.append(f"{', '.join(f'`{b.attribute}`' for b in others)}: no work between its blocks; stood in for "
                     "too while the loop's work is traced (a later list's first block may be made from its outputs)")
    if not entries and not outside and not skips and not between and not calls:
        return None, notes
    return "BlockLoop({" + ", ".join(entries) + "}" + (f", outside={outside!r}" if outside else "") \
        + (f", skips={skips!r}" if skips else "") + (f", between={between!r}" if between else "") \
        + (f", calls={calls!r}" if calls else "") + ")", notes


def _returns(b) -> list[str | None]:
    """The block's stream inputs in the order it returns their updates (None: an output no input maps onto)."""
    positional = [p.name for p in b.signature if p.kind in ("positional_only", "positional_or_keyword")]
    names = {"hidden_states": positional[0] if positional else None, "encoder_hidden_states": b.encoder_param}
    return [names.get(role) for role in b.outputs or []]
