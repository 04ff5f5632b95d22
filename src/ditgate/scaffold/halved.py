"""A root split, observed: the transformer's forward run twice more on its first call's inputs, as they were and
with every sequence-long input (not a mask) cut to its first half, as a split at the root hands rank 0 its share.
What each block list's first block and each attention module outside the lists receive on the two calls shows
whether the tables the forward builds (per-token modulation, RoPE) reach them split: FLUX.3 expands its per-token
modulation to the length of its (split) input, and no module on the transformer makes it, so the shapes of the first
call alone cannot tell."""

from __future__ import annotations

from typing import Any


def _seq_dim(shape: list[int], lengths: set[int]) -> int | None:
    """The sequence dimension of `shape`: past the batch of a 3-D or larger tensor, the first of a 2-D table
    ([tokens, features]); a 2-D [batch, features] vector whose width happens to equal a length is not one."""
    dims = range(1, len(shape)) if len(shape) >= 3 else range(min(1, len(shape)))
    return next((d for d in dims if shape[d] in lengths), None)


def _lengths(anatomy) -> set[int]:
    s = anatomy.sequence
    return {n for n in (s.image_tokens, s.text_tokens if s.joint else None) if n}


def _record(module, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """{"blocks": {"<list>.0": shapes of every tensor its first block receives (inside tuples too)}, "attention":
    {path: query length of each attention module outside the lists}} on `module(**inputs)`; None where it raised."""
    import torch

    from ditgate.inspect.observe import block_lists, is_attention_module
    from ditgate.inspect.sequence import _leaves

    seen, handles, lists = {"blocks": {}, "attention": {}}, [], block_lists(module)
    for attribute, blocks in ((a, b) for a, b in lists.items() if len(b)):
        def pre(mod, args, kwargs, key=f"{attribute}.0"):
            seen["blocks"].setdefault(key, [list(a.shape) for a in _leaves((args, kwargs))])
        handles.append(blocks[0].register_forward_pre_hook(pre, with_kwargs=True))
    for path, child in module.named_modules():
        if path and path.split(".")[0] not in lists and is_attention_module(child):
            def pre(mod, args, kwargs, key=path):
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                if torch.is_tensor(hidden) and hidden.ndim == 3:
                    seen["attention"].setdefault(key, int(hidden.shape[1]))
            handles.append(child.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            module(**inputs)
        return seen
    except Exception:  # the forward refuses a share (a grid read from its config): a root split cannot work
        return None
    finally:
        for handle in handles:
            handle.remove()


def run_halved(observed, first_calls: dict[str, tuple]) -> None:
    """`observed.halved[transformer]` = (what the blocks receive on the transformer's first call, the same on that
    call with its sequence-long inputs halved), each as `_record` returns it (`first_calls`: name -> (module, bound
    arguments)); None where no input was cut."""
    import torch

    lengths = _lengths(observed.anatomy)
    for name, (module, bound) in first_calls.items():
        cut = dict(bound)
        for k, v in bound.items():
            d = _seq_dim(list(v.shape), lengths) if torch.is_tensor(v) and "mask" not in k.lower() else None
            if d is not None and v.shape[d] % 2 == 0:
                cut[k] = v.narrow(d, 0, v.shape[d] // 2)
        changed = any(cut[k] is not bound[k] for k in bound)
        observed.halved[name] = (_record(module, bound), _record(module, cut)) if changed else None


def reached(observed, transformer: str) -> list[str]:
    """The block lists' first blocks ("<list>.0") the transformer's first call reached, when on the halved call every
    tensor each receives has its sequence dimension halved and every other as on the whole call; else empty."""
    whole, half = observed.halved.get(transformer) or (None, None)
    lengths = _lengths(observed.anatomy)
    lengths |= {sum(lengths)} if len(lengths) == 2 else set()
    called = {b.attribute for b in observed.anatomy.block_lists if b.transformer == transformer and b.called}
    if not whole or not half or not called or {k.rsplit(".", 1)[0] for k in whole["blocks"]} != called:
        return []
    for key, shapes in whole["blocks"].items():
        want = [[x // 2 if i == _seq_dim(w, lengths) else x for i, x in enumerate(w)] for w in shapes]
        if half["blocks"].get(key) != want or not any(w != h for w, h in zip(shapes, want)):
            return []
    return list(whole["blocks"])


def split_self_attention(observed, transformer: str, g, proc: dict[str, Any]) -> str | None:
    """Under a root split, the note keeping an attention group `g` outside the block lists (FLUX.3's per-mode image
    blocks in a dict of lists) as it is: unmasked self-attention whose queries came out halved on the halved call,
    whose processor passes the CP config to its kernel itself (`proc`); None where that was not observed."""
    calls = observed.halved.get(transformer) or (None, None)
    whole, half = ((c or {}).get("attention", {}).get(g.group) for c in calls)
    if proc.get("passes_cp") and g.kind == "self" and not g.mask and half and whole == g.q_len == 2 * half:
        return (f"`{g.group}` ({g.processor}): outside the block lists, self-attention whose {whole} queries came out "
                f"halved ({half}) on the halved call: the root split reaches it, and its processor passes the CP "
                "config to its kernel itself: kept")
    return None


def note(observed, transformer: str, firsts: list[str], why_not: str) -> str:
    """The comment naming the observation behind a root split decided by the halved call (`why_not`: why the first
    call's shapes alone ruled it out)."""
    whole, half = observed.halved[transformer]
    shapes = "; ".join(f"`{k}` {whole['blocks'][k]} -> {half['blocks'][k]}" for k in firsts)
    return (f"the first call's shapes alone rule out a root split ({why_not}), but the forward run on its inputs with "
            f"the sequence halved hands every block list every sequence-long tensor halved ({shapes}): a root split "
            "reaches every table it builds, a refiner list's too (none runs whole); the split at the first block "
            "instead is told apart by cp-ulysses-2")
