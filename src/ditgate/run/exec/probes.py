"""Hooks that record what a run really did, without changing it.

They prove that a feature acted: how often the last block of each block list ran (cache skips blocks), the
shapes of what the first block of each list returns (context parallelism divides one dimension of them), how many
calls each transformer gets, how often the VAE decoder ran (VAE parallelism splits tiles), the initial noise, the
transformer's output at its first call (the first-step check of ditgate.gates.first_step) and the final latents.
The noise is the scheduler's first input where the pipeline steps a scheduler (in the layout of the final latents),
else the first transformer input; the final latents come from the step callback, else the scheduler's last step
(ditgate.core.steps). They also time the transformer calls (CUDA events on a GPU, so nothing waits for the
device), which tells how much of a pipeline call a transformer speedup can act on.

With `attach(pipe, compiled=True)` every hook runs outside torch.compile (`torch.compiler.disable`): a compiled
block calls it eagerly. Attaching the probes once per row keeps compiled code's guards stable from call to call
(`reset` clears the counts). Rows that do not compile leave torch's compiler unimported.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ditgate.core.components import block_lists, transformers_of
from ditgate.core.steps import SchedulerSteps, tensor_of


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


@dataclass
class Probes:
    """Counters and captures of one pipeline call; `facts()` is what gets stored in the row result."""

    last_block_calls: dict[str, int] = field(default_factory=dict)
    block_calls: dict[str, list[int]] = field(default_factory=dict)  # calls of every block of each list
    block_seq_len: dict[str, int] = field(default_factory=dict)
    block_shapes: dict[str, list[list[int]]] = field(default_factory=dict)  # shapes block 0 of each list returned
    transformer_calls: int = 0
    calls_by_transformer: dict[str, int] = field(default_factory=dict)  # component name -> calls
    steps_by_transformer: dict[str, list[int]] = field(default_factory=dict)  # component -> the steps it served
    decoder_calls: int = 0
    noise: torch.Tensor | None = None
    latents: torch.Tensor | None = None  # from the step callback; see final_latents() for every pipeline
    first_output: torch.Tensor | None = None  # what the first transformer call returned (its first tensor)
    _steps: SchedulerSteps | None = None
    _handles: list = field(default_factory=list)
    _spans: list = field(default_factory=list)  # (start, end) of each transformer call: perf_counter or CUDA events

    def reset(self) -> None:
        """Forget what the previous call recorded; the hooks stay attached."""
        self.last_block_calls = {k: 0 for k in self.last_block_calls}
        self.block_calls = {k: [0] * len(v) for k, v in self.block_calls.items()}
        self.block_seq_len.clear()
        self.block_shapes.clear()
        self.calls_by_transformer = {k: 0 for k in self.calls_by_transformer}
        self.steps_by_transformer = {k: [] for k in self.steps_by_transformer}
        self.transformer_calls = self.decoder_calls = 0
        self.noise = self.latents = self.first_output = None
        self._spans.clear()
        if self._steps is not None:
            self._steps.reset()

    def attach(self, pipe, compiled: bool = False) -> "Probes":
        eager = torch.compiler.disable if compiled else (lambda hook: hook)
        for tname, transformer in transformers_of(pipe).items():
            self.calls_by_transformer[tname] = 0
            self.steps_by_transformer[tname] = []
            self._handles.append(transformer.register_forward_pre_hook(eager(self._on_transformer), with_kwargs=True))
            self._handles.append(transformer.register_forward_pre_hook(eager(self._count_calls(tname))))
            self._handles.append(transformer.register_forward_hook(eager(self._after_transformer)))
            for lname, blocks in block_lists(transformer).items():
                key = f"{tname}.{lname}"
                self.last_block_calls[key] = 0
                self._handles.append(blocks[-1].register_forward_hook(eager(self._counter(key))))
                self.block_calls[key] = [0] * len(blocks)
                for i, block in enumerate(blocks):  # a cache with Bn_compute_blocks > 0 skips middle blocks only
                    self._handles.append(block.register_forward_hook(eager(self._block_counter(key, i))))
                self._handles.append(blocks[0].register_forward_hook(eager(self._seq_len(key))))
        self._steps = SchedulerSteps(pipe).__enter__()
        decoder = getattr(getattr(pipe, "vae", None), "decoder", None)
        if isinstance(decoder, torch.nn.Module):
            self._handles.append(decoder.register_forward_hook(eager(self._on_decoder)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._steps is not None:
            self._steps.__exit__()

    def _on_transformer(self, module, args, kwargs):
        self.transformer_calls += 1
        first = _first_tensor(args, kwargs)
        if self.noise is None and first is not None:
            self.noise = first.detach().float().cpu().clone()
        self._spans.append([_now(first), None])

    def _after_transformer(self, module, args, output):
        if self.first_output is None:
            first = tensor_of(output, "sample")  # the prediction: a tensor, a tuple's first, a BaseOutput's
            self.first_output = None if first is None else first.detach().float().cpu().clone()
        if self._spans and self._spans[-1][1] is None:
            self._spans[-1][1] = _now(self._spans[-1][0])

    def _count_calls(self, name):
        def hook(module, args):
            self.calls_by_transformer[name] += 1
            step = self._steps.calls if self._steps is not None and self._steps.available else None
            if step is not None and step not in self.steps_by_transformer[name][-1:]:
                self.steps_by_transformer[name].append(step)  # the scheduler steps made before this call
        return hook

    def _counter(self, key):
        def hook(module, args, output):
            self.last_block_calls[key] += 1
        return hook

    def _block_counter(self, key, index):
        def hook(module, args, output):
            self.block_calls[key][index] += 1
        return hook

    def _seq_len(self, key):
        # Tokens leaving the first block: a context-parallel plan may split at the transformer's entry or at the
        # first block itself (a hook inside its forward), so the block's output is where a split is always visible.
        def hook(module, args, output):
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            tokens = sum(int(t.shape[1]) for t in outputs if isinstance(t, torch.Tensor) and t.dim() == 3)
            if tokens and key not in self.block_seq_len:
                self.block_seq_len[key] = tokens
            if key not in self.block_shapes:
                self.block_shapes[key] = [list(t.shape) for t in outputs if isinstance(t, torch.Tensor)]
        return hook

    def _on_decoder(self, module, args, output):
        self.decoder_calls += 1

    @property
    def scheduler_steps(self) -> SchedulerSteps | None:
        """The scheduler's step count of the call (ditgate.core.steps), for other probes keyed by step."""
        return self._steps

    def transformer_time(self) -> float | None:
        """Seconds spent in transformer calls (call after the device finished: run_row synchronizes first)."""
        spans = [(start, end) for start, end in self._spans if end is not None]
        if not spans:
            return None
        if isinstance(spans[0][0], float):
            return sum(end - start for start, end in spans)
        return sum(start.elapsed_time(end) for start, end in spans) / 1000.0

    def step_callback(self, pipe, step: int, timestep, callback_kwargs: dict[str, Any]):
        """For `callback_on_step_end`: keeps the latents after the last step."""
        self._keep_latents(callback_kwargs.get("latents"))
        return callback_kwargs

    def legacy_callback(self, step: int, timestep, latents) -> None:
        """For the older `callback(step, timestep, latents)` argument (StableAudioPipeline has no other)."""
        self._keep_latents(latents)

    def _keep_latents(self, latents) -> None:
        if isinstance(latents, torch.Tensor):
            self.latents = latents.detach().float().cpu().clone()

    def final_latents(self) -> tuple[torch.Tensor | None, str | None]:
        """The latents after the last step and where they came from: the step callback, else the scheduler's last
        step (for pipelines without a callback), else (None, None)."""
        if self.latents is not None:
            return self.latents, "callback"
        last = self._steps.last_sample if self._steps is not None else None
        return (last, "scheduler") if last is not None else (None, None)

    def initial_noise(self) -> torch.Tensor | None:
        """The initial latents in the layout of the final latents: the scheduler's first input where the pipeline
        steps a scheduler, else the first transformer input, a batched classifier-free-guidance input
        (`torch.cat([latents] * 2)`) reduced to one copy. None when the layouts cannot be matched."""
        latents, _ = self.final_latents()
        first = self._steps.first_sample if self._steps is not None else None
        if first is not None and latents is not None and first.shape == latents.shape:
            return first
        noise = self.noise
        if noise is None or latents is None or noise.shape == latents.shape:
            return noise
        batch = latents.shape[0]
        if noise.shape[1:] == latents.shape[1:] and batch and noise.shape[0] % batch == 0:
            copies = noise.split(batch)
            if all(torch.equal(c, copies[0]) for c in copies[1:]):
                return copies[0]
        return None

    def facts(self, steps: int | None) -> dict[str, Any]:
        return {
            "last_block_calls": dict(self.last_block_calls),
            "block_calls": {k: list(v) for k, v in self.block_calls.items()},
            "block_seq_len": dict(self.block_seq_len),
            "block_shapes": {k: [list(s) for s in v] for k, v in self.block_shapes.items()},
            "transformer_calls": self.transformer_calls,
            "calls_by_transformer": dict(self.calls_by_transformer),
            "steps_by_transformer": {k: list(v) for k, v in self.steps_by_transformer.items()},
            "calls_per_step": (self.transformer_calls / steps) if steps else None,
            "decoder_calls": self.decoder_calls,
            "transformer_time_s": self.transformer_time(),
            "latents_from": self.final_latents()[1],
            "scheduler_steps": self._steps.calls if self._steps is not None else None,
        }


def _now(like):
    """A timestamp on the clock of `like`'s device: a recorded CUDA event, else perf_counter()."""
    if isinstance(like, torch.cuda.Event) or (isinstance(like, torch.Tensor) and like.is_cuda):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def sharded_weights(module: torch.nn.Module) -> dict[str, Any]:
    """DTensor parameters of `module` and whether each local shard is its share of the global tensor."""
    from torch.distributed.tensor import DTensor, Shard

    sharded, wrong = 0, []
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor):
            continue
        for dim_placement, mesh_size in zip(param.placements, param.device_mesh.shape):
            if isinstance(dim_placement, Shard):
                sharded += 1
                dim = dim_placement.dim
                expected = -(-param.shape[dim] // mesh_size)
                if param.to_local().shape[dim] not in (expected, param.shape[dim] // mesh_size):
                    wrong.append(name)
    return {"sharded": sharded, "wrong_size": wrong}


def quantized_weights(module: torch.nn.Module) -> int:
    """Parameters of `module` held as a quantized tensor subclass (what torchao's quantization leaves), DTensors
    not counted."""
    from torch.distributed.tensor import DTensor

    count = 0
    for param in module.parameters():
        data = param.data if isinstance(param, torch.nn.Parameter) else param
        if type(data) is not torch.Tensor and not isinstance(data, DTensor):
            count += 1
    return count


def compiled_modules(module: torch.nn.Module) -> int:
    """Submodules of `module` (itself included) that torch.compile wrapped (`Module.compile()` or OptimizedModule)."""
    return sum(1 for m in module.modules() if getattr(m, "_compiled_call_impl", None) is not None
               or type(m).__name__ == "OptimizedModule")


# -- how fast the residual a cache reuses changes -------------------------------------------------------------------
# A block cache (DBCache) computes the front blocks of a step and reuses, for the rest, the residual (output minus
# input) those blocks added at the last computed step. That only works when the residual changes little between
# steps: on trained DiTs it does (cache-dit's default decision threshold on the relative change is 0.08), on freshly
# initialised weights it may change by more than its own size every step, and then no cache configuration can pass a
# latent gate however right the adapter is. ResidualChange measures, on a cache row's caching-off twin (adapter
# applied, nothing cached: proven equal to the baseline), for every block
# list of every transformer, the relative L1 change of the list's residual (the hidden states leaving its last block
# minus those entering its first block) between consecutive steps, for each transformer call of a step separately
# (a separate classifier-free-guidance call is compared with its own previous call). `summary()` is stored in the
# row's facts as `residual_change`; ditgate.run.judge.volatility reads it.


def _hidden_in(args, kwargs) -> torch.Tensor | None:
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    return next((a for a in args if isinstance(a, torch.Tensor)), None)


def _hidden_out(output, like: torch.Tensor) -> torch.Tensor | None:
    """The output tensor in the input's layout that moved least from it (the residual stream, not a side stream)."""
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    same = [t for t in outputs if isinstance(t, torch.Tensor) and t.shape == like.shape]
    if not same:
        return None
    return min(same, key=lambda t: float((t.detach().float().cpu() - like).abs().mean()))


class ResidualChange:
    """Hooks on the first and last block of each block list; `steps` reads the step count (ditgate.core.steps)."""

    def __init__(self, steps) -> None:
        self.steps = steps
        self.changes: dict[str, list[float]] = {}
        self._previous: dict[tuple[str, int], torch.Tensor] = {}
        self._entering: dict[str, torch.Tensor] = {}
        self._slot = {"step": -1, "call": -1}
        self._handles: list = []

    def attach(self, pipe) -> "ResidualChange":
        for tname, transformer in transformers_of(pipe).items():
            self._handles.append(transformer.register_forward_pre_hook(self._on_call))
            for lname, blocks in block_lists(transformer).items():
                key = f"{tname}.{lname}"
                self.changes[key] = []
                self._handles.append(blocks[0].register_forward_pre_hook(self._enter(key), with_kwargs=True))
                self._handles.append(blocks[-1].register_forward_hook(self._leave(key)))
        return self

    def reset(self) -> None:
        """Forget the previous call (the hooks stay attached)."""
        self.changes = {k: [] for k in self.changes}
        self._previous.clear()
        self._entering.clear()
        self._slot.update(step=-1, call=-1)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_call(self, module, args) -> None:
        step = self.steps.calls if self.steps is not None else 0
        self._slot["call"] = self._slot["call"] + 1 if step == self._slot["step"] else 0
        self._slot["step"] = step

    def _enter(self, key):
        def hook(module, args, kwargs):
            hidden = _hidden_in(args, kwargs)
            if hidden is not None:
                self._entering[key] = hidden.detach().float().cpu().clone()
        return hook

    def _leave(self, key):
        def hook(module, args, output):
            entering = self._entering.pop(key, None)
            leaving = None if entering is None else _hidden_out(output, entering)
            if leaving is None:
                return
            residual = leaving.detach().float().cpu() - entering
            slot = (key, self._slot["call"])
            previous = self._previous.get(slot)
            if previous is not None and previous.shape == residual.shape:
                scale = float(previous.abs().mean())
                if scale > 0:
                    self.changes[key].append(float((residual - previous).abs().mean()) / scale)
            self._previous[slot] = residual
        return hook

    def summary(self) -> dict[str, Any] | None:
        """{"median": the largest per-list median change, "per_list": {list: {median, max, steps}}}; None: no
        list had two steps to compare."""
        per_list = {key: {"median": statistics.median(v), "max": max(v), "compared": len(v)}
                    for key, v in self.changes.items() if v}
        if not per_list:
            return None
        worst = max(per_list, key=lambda k: per_list[k]["median"])
        return {"median": per_list[worst]["median"], "list": worst, "per_list": per_list}
