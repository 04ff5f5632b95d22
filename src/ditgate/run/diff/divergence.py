"""Where a parallel run first departs from its baseline: record every module's output on the first transformer
call, bring each rank's piece back to the full tensor, compare in execution order.

The recorder hooks every module of the text encoders and transformers of a pipeline (forward hooks: a module's
output is recorded when it returns, so children come before their parent) and the attention modules' mask and
rotary-embedding inputs (pre-hooks). The first transformer call ends the pipeline call (`Stop`).

On a candidate rank every tensor is first made whole: a DTensor (tensor parallelism) through `full_tensor()`; a
local tensor whose shape differs from the baseline's in one dimension is all-gathered along it (the sequence for
Ulysses and ring, the heads of an attention tensor after Ulysses' all-to-all, a TP shard with a local output). When
the gathered dimension holds two segments (the text and image tokens of a joint attention, split separately at the
transformer's entry), each rank's piece is `[text_r, image_r]` (or `[image_r, text_r]`): it is reassembled stream by
stream, in the order nearest the baseline's samples (the order is the model's; a plain concatenation is never
right there, so a RoPE table sliced over the joint sequence shows as a divergence). The transformer's own output is never
gathered: the pipeline uses it as it is, so a missing gather shows there.

A block's output is gathered only along the dimension the integration's CP_SPLIT_DIMS declares for its block list
(None: it must be whole on every rank); a block split otherwise counts as diverged, with the reason.

By default only a summary of each tensor is kept (`Summary`: norm, largest magnitude, values at fixed sampled
indices, a hash of the bytes); `full=` names the modules whose whole tensors are kept (the second pass, around
the first divergence), `inputs=` those whose first input is kept too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ditgate.core.components import block_lists, transformers_of

SAMPLES = 256  # sampled elements per tensor in a summary
INPUT_KEYS = ("attention_mask", "image_rotary_emb", "rotary_emb", "freqs_cis")  # attention inputs recorded


class Stop(Exception):
    """Raised after the first transformer call: the rest of the pipeline call is not needed."""


def sample_indices(numel: int, device) -> torch.Tensor:
    """The same flat indices for a tensor of `numel` elements in every process."""
    gen = torch.Generator("cpu").manual_seed(numel)
    return torch.randint(0, max(numel, 1), (min(SAMPLES, numel),), generator=gen).to(device)


def digest(flat: torch.Tensor) -> str:
    """A fingerprint of the bytes of `flat`, computed where the tensor is (no copy to the host): two position-weighted
    sums of its bit patterns. Equal bytes give equal digests in every process; a changed bit changes it."""
    flat = flat.contiguous()
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    kinds = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = flat.view(kinds[flat.element_size()]).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
    return f"{int((bits * weights).sum()) & 0xFFFFFFFFFFFF:012x}{int(bits.sum()) & 0xFFFF:04x}"


def summarize(t: torch.Tensor) -> dict[str, Any]:
    flat = t.detach().reshape(-1)
    values = flat.to(torch.float64)
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
            "norm": float(values.norm()) if values.numel() else 0.0,
            "absmax": float(values.abs().max()) if values.numel() else 0.0,
            "samples": values[sample_indices(values.numel(), values.device)].cpu().tolist(),
            "hash": digest(flat)}


def _flat(value, prefix: str = "", depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a module output (tensor, tuple, list, dict or diffusers output), each with a suffix."""
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if depth > 2:
        return []
    if isinstance(value, dict):  # diffusers' BaseOutput is an OrderedDict
        items = list(value.items())
    elif isinstance(value, (tuple, list)):
        items = list(enumerate(value))
    else:
        return []
    found = []
    for key, item in items:
        found += _flat(item, f"{prefix}[{key}]", depth + 1)
    if len(found) == 1 and depth == 0:  # a single tensor in a tuple keeps the plain module name
        return [(prefix, found[0][1])]
    return found


@dataclass
class Recorder:
    """Records one pipeline call up to the end of its first transformer call."""

    reference: dict[str, dict[str, Any]] | None = None  # the baseline's summaries (candidate ranks only)
    segments: list[int] | None = None  # token counts of the two joint-sequence streams (from the baseline)
    full: set[str] = field(default_factory=set)  # keys whose whole tensors are kept
    inputs: set[str] = field(default_factory=set)  # module names whose first input is kept whole
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> summary, in execution order
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> whole tensor (CPU, own dtype)
    notes: dict[str, str] = field(default_factory=dict)  # key -> how it was gathered (candidate)
    split_dims: dict[str, int | None] | None = None  # an integration's CP_SPLIT_DIMS (candidate ranks)
    crash: dict[str, str] | None = None  # the call raised: the innermost module it was in, and the error
    callers: dict[str, str] = field(default_factory=dict)  # module key -> the module whose forward called it
    processors: dict[str, str] = field(default_factory=dict)  # attention module key -> its processor's class
    entered: dict[str, int] = field(default_factory=dict)  # module key -> outputs recorded when it was first entered
    returned: bool = False  # a transformer call returned (whatever its output holds)
    _calls: dict[str, int] = field(default_factory=dict)
    _open: list = field(default_factory=list)  # modules entered and not yet returned, innermost last
    _blocks: dict[str, str] = field(default_factory=dict)  # a block's key -> its block list ("transformer.blocks")
    _handles: list = field(default_factory=list)
    _roots: set[str] = field(default_factory=set)
    _per_rank: set[str] = field(default_factory=set)  # keys whose local shape no gather along one dim can make whole

    def attach(self, pipe) -> "Recorder":
        """Hook the text encoders and transformers of `pipe`."""
        comps = getattr(pipe, "components", {})
        encoders = {k: v for k, v in comps.items() if k.startswith("text_encoder") and isinstance(v, torch.nn.Module)}
        return self.attach_components({**encoders, **transformers_of(pipe)})

    def attach_components(self, components: dict[str, torch.nn.Module]) -> "Recorder":
        """Hook every module of `components` (name -> module; names starting with "transformer" end the call)."""
        for cname, component in components.items():
            is_transformer = cname.startswith("transformer")
            for lname, blocks in (block_lists(component) if is_transformer else {}).items():
                self._blocks.update((f"{cname}.{lname}.{i}", f"{cname}.{lname}") for i in range(len(blocks)))
            for name, module in component.named_modules():
                key = f"{cname}.{name}" if name else cname
                if not name and is_transformer:
                    self._roots.add(key)
                    self._handles.append(module.register_forward_pre_hook(self._root_inputs(key), with_kwargs=True))
                code = getattr(type(module).forward, "__code__", None)
                if name and code is not None and any(k in code.co_varnames for k in INPUT_KEYS):
                    self._handles.append(module.register_forward_pre_hook(self._pre(key), with_kwargs=True))
                self._handles.append(module.register_forward_pre_hook(self._enter(key, key in self._roots),
                                                                      with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._post(key, root=key in self._roots)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- hooks -----------------------------------------------------------------------------------------------------
    def _root_inputs(self, key):
        def hook(module, args, kwargs):
            if self.segments is None and self.reference is None:  # baseline: the joint sequence's two streams
                streams = [kwargs.get(k) for k in ("encoder_hidden_states", "hidden_states")]
                if all(isinstance(s, torch.Tensor) and s.dim() == 3 for s in streams):
                    self.segments = [int(s.shape[1]) for s in streams]
        return hook

    def _pre(self, key):
        def hook(module, args, kwargs):
            for name in INPUT_KEYS:
                for suffix, t in _flat(kwargs.get(name), ""):
                    self._keep(f"{key}:{name}{suffix}", t)
        return hook

    def _enter(self, key, root: bool):
        def hook(module, args, kwargs):
            self.entered.setdefault(key, len(self.summaries))
            if self._open and key not in self.callers:
                self.callers[key] = self._open[-1]
            processor = getattr(module, "processor", None)
            if processor is not None and key not in self.processors:
                self.processors[key] = type(processor).__name__
            self._open.append(key)
            if key in self.inputs:
                first = kwargs.get("hidden_states", args[0] if args else None)
                if isinstance(first, torch.Tensor):
                    self._keep(f"{key}:input", first, root=root)
        return hook

    def _post(self, key, root: bool):
        def hook(module, args, output):
            if self._open and self._open[-1] == key:
                self._open.pop()
            count = self._calls.get(key, 0) + 1
            self._calls[key] = count
            name = key if count == 1 else f"{key}#{count}"
            for suffix, t in _flat(output):
                self._keep(name + suffix, t, root=root)
            if root:
                self.returned = True
                raise Stop()
        return hook

    # -- recording -------------------------------------------------------------------------------------------------
    def _keep(self, key: str, t: torch.Tensor, root: bool = False) -> None:
        with torch.no_grad():
            whole = self._whole(key, t, root)
        if whole is None:
            self.summaries[key] = {"shape": list(getattr(t, "shape", [])), "missing": self.notes.get(key, "")}
            if key in self._per_rank:
                self.summaries[key]["per_rank"] = True
            return
        self.summaries[key] = summarize(whole)
        if key in self.full or key.endswith(":input"):
            self.tensors[key] = whole.detach().cpu().clone()

    def _whole(self, key: str, t: torch.Tensor, root: bool) -> torch.Tensor | None:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            self.notes[key] = "DTensor.full_tensor()"
            return t.full_tensor()
        if self.reference is None:
            return t
        import torch.distributed as dist

        ref = self.reference.get(key)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if ref is None or "missing" in ref or world == 1 or list(t.shape) == ref["shape"] or root:
            if ref is not None and list(t.shape) != ref["shape"]:
                self.notes[key] = f"shape {list(t.shape)} where the baseline has {ref['shape']} (not gathered)"
                return None
            return t
        want = ref["shape"]
        dims = [d for d in range(len(want)) if len(want) == t.dim() and want[d] != t.shape[d]]
        if len(dims) != 1 or t.shape[dims[0]] * world != want[dims[0]]:
            self.notes[key] = (f"per rank: local shape {list(t.shape)} cannot be gathered into {want} over {world} "
                               "ranks (built per rank, e.g. a mask over local queries and every key); not compared")
            self._per_rank.add(key)
            return None
        dim = dims[0]
        block = self._blocks.get(key.split("[")[0])
        if block is not None and self.split_dims:
            from ditgate.run.judge.proofs import split_dim

            declared, said = split_dim(block, self.split_dims)
            if isinstance(declared, (tuple, list)):  # per stream: the one this output is ("[1]": the second)
                stream = re.match(r"\[(\d+)\]", key[len(key.split("[")[0]):])
                declared = declared[int(stream.group(1))] if stream and int(stream.group(1)) < len(declared) else None
                declared = "None (kept whole)" if declared is None else declared
            if said and declared != dim % t.dim():
                self.notes[key] = (f"split on dim {dim} ({list(t.shape)} of {want}) where CP_SPLIT_DIMS declares "
                                   f"{declared} for {block.split('.', 1)[-1]}")
                return None
        pieces = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(pieces, t.contiguous())
        options = {f"concatenated along dim {dim}": torch.cat(pieces, dim)}
        near = _sample_error(options[f"concatenated along dim {dim}"], ref) <= 1e-2 * max(ref["absmax"], 1e-30)
        local = t.shape[dim]
        for groups in range(2, 9) if not near else ():  # a flattened (batch x tokens) dimension: each rank holds
            if local % groups == 0:  # its tokens of each item, so its piece is [item 0's, item 1's, ...]
                parts = torch.stack([p.unflatten(dim, (groups, local // groups)) for p in pieces], dim + 1)
                options[f"gathered along dim {dim} in {groups} groups"] = parts.flatten(dim, dim + 2)
        if self.segments and sum(self.segments) == want[dim] and all(s % world == 0 for s in self.segments):
            options = {}  # a joint sequence: each rank holds a piece of both streams; which comes first is the model's
            for order in (self.segments, self.segments[::-1]):
                parts = [p.split([s // world for s in order], dim) for p in pieces]
                joined = torch.cat([torch.cat([p[i] for p in parts], dim) for i in range(len(order))], dim)
                options[f"gathered along dim {dim} per stream ({order[0]}+{order[1]} tokens)"] = joined
        name, best = min(options.items(), key=lambda kv: _sample_error(kv[1], ref))
        self.notes[key] = name
        return best


def _sample_error(t: torch.Tensor, ref: dict[str, Any]) -> float:
    flat = t.reshape(-1).to(torch.float64)
    values = flat[sample_indices(flat.numel(), flat.device)].cpu()
    return float((values - torch.tensor(ref["samples"], dtype=torch.float64)).abs().max()) if len(values) else 0.0


def capture(pipe, request, recorder: Recorder) -> Recorder:
    """Run `pipe` on `request` until its first transformer call has returned, with `recorder` attached. When
    the call raises inside a hooked module, `recorder.crash` names the innermost module it was in."""
    from ditgate.run.exec.execute import generate
    from ditgate.run.exec.probes import Probes

    recorder.attach(pipe)
    try:
        generate(pipe, request, Probes())
    except Stop:
        pass
    except Exception as exc:  # noqa: BLE001 - where the row raises is the answer when it raises first
        if not recorder._open:
            raise
        recorder.crash = {"module": recorder._open[-1], "error": f"{type(exc).__name__}: {exc}"}
    finally:
        recorder.detach()
    if recorder.crash is None and not recorder.returned:
        found = ", ".join(sorted(recorder._roots)) or "none"
        raise RuntimeError(f"the pipeline call ended without calling a transformer (hooked: {found}; a pipeline "
                           "that calls its denoiser through another component is not covered)")
    return recorder


# -- comparison ----------------------------------------------------------------------------------------------------
def compare_summaries(base: dict[str, dict], cand: dict[str, dict], tolerance: float) -> list[dict[str, Any]]:
    """One line per baseline key, in the baseline's execution order: error estimates from the sampled values."""
    lines = []
    for index, (key, b) in enumerate(base.items()):
        c = cand.get(key)
        line = {"index": index, "module": key, "shape": b.get("shape")}
        if c is None:
            line.update(status="not reached", diverged=True, rel=float("inf"))
        elif c.get("per_rank"):  # built per rank (a mask over the local queries): no whole tensor to compare
            line.update(status="not compared", diverged=False, skipped=c.get("missing", ""))
        elif "missing" in c or "missing" in b or c["shape"] != b["shape"]:
            line.update(status=c.get("missing") or f"shape {c['shape']} vs {b['shape']}", diverged=True,
                        rel=float("inf"))
        else:
            sb, sc = torch.tensor(b["samples"], dtype=torch.float64), torch.tensor(c["samples"], dtype=torch.float64)
            max_abs = float((sb - sc).abs().max()) if len(sb) else 0.0
            scale = max(b["absmax"], 1e-30)
            norm_rel = abs(c["norm"] - b["norm"]) / max(b["norm"], 1e-30)
            rel = max(max_abs / scale, norm_rel)
            line.update(status="identical" if c["hash"] == b["hash"] else "differs", max_abs=max_abs,
                        rel=rel, psnr=_psnr(sb, sc, scale), diverged=rel > tolerance)
        lines.append(line)
    return lines


def _psnr(a: torch.Tensor, b: torch.Tensor, peak: float) -> float:
    mse = float(((a - b) ** 2).mean()) if len(a) else 0.0
    return float("inf") if mse == 0 else float(10 * torch.log10(torch.tensor(peak * peak / mse)))


def exact_metrics(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """max-abs, relative max-abs and PSNR (peak: the baseline's largest magnitude) over whole tensors."""
    a64, b64 = a.reshape(-1).to(torch.float64), b.reshape(-1).to(torch.float64)
    peak = max(float(a64.abs().max()) if a64.numel() else 0.0, 1e-30)
    max_abs = float((a64 - b64).abs().max()) if a64.numel() else 0.0
    return {"max_abs": max_abs, "rel": max_abs / peak, "psnr": _psnr(a64, b64, peak)}
