"""`ditgate inspect`: the anatomy of a diffusion pipeline, as the GATE CHECK needs it, and a draft plan.

`inspect_model(model, ...)` loads a pipeline (a folder or `zoo:NAME`), runs it once for a few steps with hooks
(`ditgate.inspect.observe`), reads cache-dit's registries (`ditgate.inspect.plan.support`) and returns an `Anatomy`.
`analyse(pipe, call)` does the same for a pipeline object already in memory.

JSON keys (`Anatomy.to_dict()`, printed by `ditgate inspect --json`):

- `model`, `pipeline` {name, cls, module, source_file}, `call` (the pipeline call that was run; tensors left out),
  `steps` (denoising steps of that run).
- `components`: {transformers, text_encoders, vaes, others}: lists of {name, cls, module, source_file, parameters}.
- `block_lists`: one per block ModuleList directly on a transformer: `transformer`, `attribute`, `length`,
  `block_class`, `block_module`, `source_file`, `signature` [{name, kind, has_default}], `returns` (annotation),
  `called` (seen during the run), `call` {positional, keyword, inputs {param: summary}} (block 0, first call),
  `outputs` (observed roles in return order: "hidden_states" / "encoder_hidden_states" / "other"),
  `output_shapes`, `role_evidence` ("flow" = the output reappears as the next block's input, "shape",
  "similarity"), `encoder_param` (the input whose update is returned, if any), `pattern` ("Pattern_0".."Pattern_5"
  or null), `pattern_reason`, `check_forward_pattern` (whether cache-dit's static name check passes with that
  pattern), `patch_functor_needed`, `loop_findings` (extra work seen between block calls).
- `between_lists`: findings about what happens between two block lists of one transformer.
- `calls_per_step` (transformer calls per denoising step, all transformers together), `calls_by_step`,
  `transformer_calls` {transformer: calls in the run}, `has_separate_cfg` (true when a step calls the transformer
  twice), `batch` (batch of the hidden states entering the blocks).
- `attention`: `heads`, `kv_heads`, `head_dim`, `gqa`, `mask` (a mask reaches attention), `mask_sources`,
  `mask_all_true`, `fused_qkv` (Linear layers holding fused projections), `non_pytorch_kernels`,
  `attention_backends` (processor backends that are set), `qk_norm_across_heads`, `groups` (one per attention module
  group such as `transformer_blocks.*.attn`: transformer, group, cls, processor, calls, heads, kv_heads, head_dim,
  kernel_heads, kernel_kv_heads, kernel_head_dim, q_len, kv_len, kind "self"/"joint"/"cross", mask, enable_gqa).
- `sequence`: `image_tokens` (length of the hidden states entering the first block list), `text_tokens`,
  `attention_tokens` (image + text for joint attention), `joint`, `per_token_tables` (modules called before the
  blocks whose outputs are per-token tables, e.g. RoPE), `gather_candidates` (modules after the blocks whose output
  still has the image sequence), `divisibility` {"2"|"4"|"8": {image_tokens, text_tokens, heads, kv_heads, ulysses,
  ring, tp}} (booleans; ulysses is "ok" or "ulysses-anything").
- `tp_layers`: per block class, its Linear layers with a suggested TP style.
- `cache_dit`: what cache-dit provides: `cache_dit_version`, `adapter` (registered BlockAdapter: prefix, function,
  transformers, block_lists, blocks_name, dummy_blocks_names, forward_patterns, has_separate_cfg, patch_functor,
  check_forward_pattern) or null, `adapter_error`, `cp_planners`, `tp_planners` {transformer: class or null},
  `text_encoder_planners`, `vae_planners` {component: class or null}, `cli_examples`.
- `warnings`: disagreements and risks found (e.g. a registered separate-CFG flag that contradicts the measurement).
- `plan`: the draft integration plan (Markdown).
- `traits` (`ditgate.inspect.trace`, `.traits`): `masks` {group: [{call, shape, padding_share, per_sample}]} over
  every call of the first step, `mask_lines`, `weak_mask`, `per_block_tensors` [{list, argument, shape, dim,
  made_by, action}], `part_counts` [{list, argument, value, tokens, end, made_by}], `grid_blocks`
  [{list, arguments, values, tokens, stream, line}], `interleaved` [[list, list]], `list_layouts`, `chunked_modulation`, `gated_mlps`,
  `reads_block_input`, `packed_parameters` [{parameter, shape, tp}], `sequence_routing`, `attention_norms`
  {norm: "per head" | "across heads"}, `repeated_modules` {module: calls per forward}, `output_types`,
  `calls_per_step` {transformer: calls per step}, `block_variants` {list: [{blocks, first, count, sublayers}]}
  (`.variants`), `experts` [{layer, blocks, experts, packed, expert_list, router, routing, evidence, shared}]
  (`.experts`); `has_separate_cfg` is true when one transformer is called twice in a step.
"""

from __future__ import annotations

from ditgate.inspect.model import source_file

import inspect
from collections import Counter
from pathlib import Path
from typing import Any

from ditgate.inspect.observe import Probe, block_lists
from ditgate.core import modular, request
from ditgate.core.request import Request
from ditgate.core.steps import SchedulerSteps
from ditgate.core.errors import PipelineRunError
from ditgate.inspect.model import Anatomy, BlockList, Component
from ditgate.inspect.sequence import analyse_sequence, divisibility
from ditgate.inspect.attention import analyse_attention, tp_survey
from ditgate.inspect.traits import analyse_traits, revise_tp_layers
from ditgate.inspect.blocks import _analyse_lists, observe_transformer, static_block_lists



















def _component(name: str, obj: Any) -> Component:
    import torch

    params = sum(p.numel() for p in obj.parameters()) if isinstance(obj, torch.nn.Module) else None
    cls = type(obj)
    return Component(name, cls.__name__, cls.__module__, source_file(cls), params)


def classify_components(pipe) -> dict[str, dict[str, Any]]:
    """Pipeline components by role: transformers, text_encoders, vaes, others (other modules and the scheduler)."""
    import torch

    groups: dict[str, dict[str, Any]] = {"transformers": {}, "text_encoders": {}, "vaes": {}, "others": {}}
    for name, obj in getattr(pipe, "components", {}).items():
        if obj is None or not (isinstance(obj, torch.nn.Module) or name == "scheduler"):
            continue
        cls_name = type(obj).__name__
        if name.startswith("text_encoder") or type(obj).__module__.startswith("transformers."):
            groups["text_encoders"][name] = obj
        elif name.startswith("vae") or cls_name.startswith("Autoencoder"):
            groups["vaes"][name] = obj
        elif isinstance(obj, torch.nn.Module) and (name.startswith("transformer") or
                                                   ("Transformer" in cls_name and block_lists(obj))):
            groups["transformers"][name] = obj
        else:
            groups["others"][name] = obj
    return groups


# -- the pipeline call --------------------------------------------------------------------------------------------
def build_call(pipe, req: Request) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments of the probe run: the request's call fitted to `pipe` (the image included), with the
    output left in latent space where the pipeline allows it; and the names dropped because the pipeline does not
    take them (a modular pipeline's blocks; a standard pipeline refuses them in `request.resolve`)."""
    if modular.is_modular_class(type(pipe)):  # the blocks' inputs, not __call__(**kwargs), say what it takes
        fitted = request.fit_blocks(req, pipe, strict=False)
        modular.configure_guider(pipe, fitted.call)  # the guider then shows the calls per step the rows make
        taken = set(pipe.blocks.input_names) | {modular.OUTPUT_KEY} | set(modular.guider_args(pipe, fitted.call))
        call = {k: v for k, v in fitted.call.items() if k in taken}
        image = request.input_image(fitted)
        if image is not None:
            call[fitted.image_key] = image
        return call, [k for k in fitted.call if k not in taken]
    call = request.call_kwargs(pipe, request.resolve(req, type(pipe)))
    if "output_type" in inspect.signature(type(pipe).__call__).parameters:
        call["output_type"] = "latent"
    return call, []


def run_probe(pipe, transformers: dict[str, Any], call: dict[str, Any], seed: int = 0) -> Probe:
    """Run `pipe(**call)` with a `Probe` (returned) and a `Trace` (kept on the probe as `probe.trace`)."""
    import torch

    from ditgate.inspect.trace import Trace

    params = inspect.signature(type(pipe).__call__).parameters
    probe = Probe(transformers)
    trace = probe.trace = Trace(transformers, probe)
    kwargs = dict(call)
    if modular.is_modular_class(type(pipe)):
        kwargs = modular.call_kwargs(pipe, call)  # and the whole state comes back
    if "generator" in params or modular.is_modular_class(type(pipe)):
        kwargs["generator"] = torch.Generator("cpu").manual_seed(seed)
    if "callback_on_step_end" in params:
        kwargs["callback_on_step_end"] = probe.step_end_callback
        steps = SchedulerSteps(None)
    else:  # step ends seen at the scheduler instead
        steps = SchedulerSteps(pipe, on_step=lambda: probe.step_end_callback(pipe, None, None, {}))
    try:
        with torch.no_grad(), probe, trace, steps:
            pipe(**kwargs)
    except Exception as exc:  # noqa: BLE001 - report any failure of the user's pipeline as a usage problem
        shown = {k: v for k, v in call.items() if isinstance(v, (bool, int, float, str, type(None)))}
        raise PipelineRunError(f"running {type(pipe).__name__} with {shown} failed: {type(exc).__name__}: {exc}. "
                               "Pass --height/--width/--frames or --call arguments that the model accepts, or "
                               "--pipeline.") from exc
    return probe
























































def modular_facts(pipe, call: dict[str, Any]) -> dict[str, Any]:
    """A ModularPipeline's recipe: the block tree, the denoise loop this call runs, the guider, the output read."""
    tree = modular.block_tree(pipe, call)
    name, modality = modular.output_name(pipe, call)
    return {"blocks": tree, "denoise_loops": modular.denoise_loops(pipe),
            "denoise_loop": next((r["path"] for r in tree if r["denoise_loop"] and r["runs"]), None),
            "guider": modular.guider_facts(pipe), "expected_calls_per_step": modular.expected_calls_per_step(pipe),
            "outputs": modular.declared_outputs(pipe), "output": name, "modality": modality}


# -- putting it together ------------------------------------------------------------------------------------------
def _separate_cfg(traits, calls_per_step: float | None) -> bool:
    """Two calls of one transformer per step; two transformers called once each are not separate CFG."""
    per_module = [n for n in traits.calls_per_step.values() if n is not None]
    if per_module:
        return max(per_module) >= 2
    return bool(calls_per_step and calls_per_step >= 2)


def _warnings(anatomy: Anatomy) -> list[str]:
    notes = []
    adapter = anatomy.cache_dit.get("adapter")
    if adapter and adapter["has_separate_cfg"] != anatomy.has_separate_cfg:
        notes.append(f"cache-dit's registered adapter uses has_separate_cfg={adapter['has_separate_cfg']}, but "
                     f"this run made {anatomy.calls_per_step} transformer calls per step: with these call "
                     "arguments the cond and uncond calls would share (or split) one cache context wrongly")
    if adapter:
        observed = {(b.transformer, b.attribute): b.pattern for b in anatomy.block_lists}
        for t, lists, patterns in zip(adapter["transformers"], adapter["block_lists"], adapter["forward_patterns"]):
            for names, pattern in zip(lists, patterns):
                for name in names.split(" + "):
                    seen = observed.get((t, name))
                    if not seen or seen == pattern:
                        continue
                    if {seen, pattern} == {"Pattern_2", "Pattern_3"}:
                        notes.append(f"{t}.{name}: cache-dit's adapter declares {pattern}, the run suggests {seen}; "
                                     "both return hidden_states only, so both forward the block's inputs")
                    else:
                        notes.append(f"{t}.{name}: cache-dit's adapter declares {pattern}, but the blocks were "
                                     f"observed to behave as {seen}: the cached blocks would mix up hidden_states "
                                     "and encoder_hidden_states; fix the adapter's forward_pattern")
    if anatomy.calls_per_step and anatomy.calls_per_step > 2:
        notes.append(f"{anatomy.calls_per_step} transformer calls per step: cache-dit alternates cond/uncond by "
                     "call parity, so more than two calls per step breaks its step accounting")
    if anatomy.calls_per_step and anatomy.calls_per_step != int(anatomy.calls_per_step):
        notes.append("the transformer calls do not divide evenly into steps; some calls happen outside the loop")
    if anatomy.attention.mask and anatomy.attention.mask_all_true:
        notes.append("the attention mask was all True on every call of the first step; a prompt that needs "
                     "padding makes it real, and CP must reorder it")
    elif anatomy.traits.weak_mask:
        notes.append("every mask was nearly all True (under 5% padding on every call of the first step): a mask "
                     "fault would not show; use a short negative prompt or prompts of different lengths")
    return notes


def analyse(pipe, call: dict[str, Any], *, model: str = "<pipeline>", steps: int | None = None,
            dropped: list[str] | None = None, seed: int = 0, request_args: list[str] | None = None,
            vae_tiling: dict[str, Any] | None = None) -> Anatomy:
    """The anatomy of `pipe`, observed by running `pipe(**call)` once (keep the call tiny). `request_args` are the
    options that make this call again (the plan's commands carry them), `vae_tiling` the tiling its rows use."""
    from ditgate.inspect.plan import call as plan_call
    from ditgate.inspect.plan import support as cachedit_support
    from ditgate.inspect.plan import draft as draft_plan

    groups = classify_components(pipe)
    transformers = groups["transformers"]
    if not transformers:
        raise PipelineRunError(f"{type(pipe).__name__} has no transformer component (components: "
                               f"{', '.join(getattr(pipe, 'components', {}))}); ditgate inspect needs a DiT")
    steps = steps or call.get("num_inference_steps") or 2
    probe = run_probe(pipe, transformers, call, seed)

    lists: list[BlockList] = []
    between: list[str] = []
    for t_name, transformer in transformers.items():
        t_lists, t_between = _analyse_lists(t_name, transformer, probe.transformers[t_name])
        lists += t_lists
        between += t_between

    primary = next(iter(transformers))
    sequence, batch = analyse_sequence(probe.transformers[primary], [b for b in lists if b.transformer == primary])
    attention = analyse_attention(transformers, probe, sequence)
    sequence.joint = any(g.kind == "joint" for g in attention.groups)
    if sequence.joint:
        sequence.attention_tokens = (sequence.image_tokens or 0) + (sequence.text_tokens or 0)
    traits = analyse_traits(transformers, probe, probe.trace, lists, sequence.image_tokens)
    for norm, kind in traits.attention_norms.items():
        if kind == "across heads" and norm not in attention.qk_norm_across_heads:
            attention.qk_norm_across_heads.append(norm)
    sequence.divisibility = divisibility(sequence, attention.heads, attention.kernel_kv_heads or attention.kv_heads)

    total = sum(r.calls for r in probe.transformers.values())
    if probe.step_calls:
        marks = [0] + probe.step_calls
        by_step = [b - a for a, b in zip(marks, marks[1:])]
        calls_per_step = float(Counter(by_step).most_common(1)[0][0])
    else:
        by_step = []
        calls_per_step = total / steps if steps else None
    tp = tp_survey(transformers, probe)

    revise_tp_layers(tp, traits)
    if traits.masks:  # over every call of the first step, not only the first one
        attention.mask_all_true = all(c["padding_share"] == 0 for calls in traits.masks.values() for c in calls)
    support = cachedit_support.lookup(pipe, transformers, groups["text_encoders"], groups["vaes"])
    public_call = {k: v for k, v in call.items() if isinstance(v, (str, int, float, bool, type(None), list))}
    anatomy = Anatomy(
        model=model, pipeline=_component("pipeline", pipe), call=public_call, steps=steps,
        components={k: [_component(n, o) for n, o in v.items()] for k, v in groups.items()},
        block_lists=lists, between_lists=between, calls_per_step=calls_per_step, calls_by_step=by_step,
        transformer_calls={n: r.calls for n, r in probe.transformers.items()},
        has_separate_cfg=_separate_cfg(traits, calls_per_step), batch=batch, attention=attention,
        sequence=sequence, tp_layers=tp, cache_dit=support.to_dict(), traits=traits,
        modular=modular_facts(pipe, call) if modular.is_modular_class(type(pipe)) else None,
        request_args=list(request_args or []),
        sizes=plan_call.phase_sizes(pipe, call, vae_tiling or {}, sequence.image_tokens).to_dict())
    anatomy.warnings = _warnings(anatomy)
    if dropped:
        anatomy.warnings.append(f"the pipeline's __call__ does not take {dropped}; they were left out of the run")
    anatomy.plan = draft_plan.render(anatomy)
    return anatomy


def inspect_model(model, log=None, on_load=None) -> Anatomy:
    """Load `model` (a ditgate.core.model.Model; a folder or `zoo:NAME` is opened with its defaults) and return its
    anatomy, observed on the model's call. A call that falls back to the pipeline's default size or steps and is
    estimated (from its FLOP count) to take long on a CPU is announced through `log` before it runs. `on_load` is
    called with the loaded pipeline before the observed run (to add hooks of one's own)."""
    from ditgate.core.model import Model
    from ditgate.inspect.plan import call as plan_call

    if not isinstance(model, Model):
        model = Model.open(model)
    pipe = model.load()
    call, dropped = build_call(pipe, model.request)
    if on_load is not None:
        on_load(pipe)
    if log is not None:
        warning = plan_call.default_cost(model, pipe, call, plan_call.announce_above())
        if warning:
            log(f"inspect: {warning}")
    return analyse(pipe, call, model=model.name, steps=call.get("num_inference_steps"), dropped=dropped,
                   seed=model.request.seed, request_args=plan_call.request_args(model),
                   vae_tiling=model.request.vae_tiling)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder, then rename."""
    import os
    import tempfile

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


__all__ = ["Anatomy", "analyse", "inspect_model", "build_call", "classify_components", "observe_transformer",
           "static_block_lists", "write_text_atomic"]
