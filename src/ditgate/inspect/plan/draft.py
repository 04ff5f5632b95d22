"""The draft integration plan (Markdown) that `ditgate inspect` derives from an `Anatomy`.

Phases in the skill's order: Cache -> CP -> TP -> TE-P -> VAE-P -> CLI -> testing. Each phase states what cache-dit
already provides, the concrete choices the observed run suggests, the items to tick, and the `ditgate run` rows
that check it. Thresholds are not repeated here: `ditgate run` applies the gates in `checklists/gates.json`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ditgate.inspect.plan import call as plan_call
from ditgate.inspect.plan import traits as plan_traits
from ditgate.inspect.model import call_size, latent_words
from ditgate.inspect.traits import split_points

if TYPE_CHECKING:
    from ditgate.inspect.model import Anatomy, BlockList

# Row names of `ditgate run` that check each phase (its default matrix uses the same names).
PHASE_ROWS = {
    "cache": ["baseline", "cache"],
    "cp": ["baseline", "cp-ulysses-2", "cp-ring-2"],
    "tp": ["baseline", "tp-2"],
    "tep": ["baseline", "tp-2+tep"],
    "vaep": ["baseline", "tp-2+vaep"],
    "testing": ["baseline", "cache", "cp-ulysses-2", "cp-ring-2", "tp-2", "tp-2+tep", "tp-2+vaep",
                "cache+ulysses-2", "hybrid-u2xtp2"],
}
PLUGIN = "integration.py"


def run_command(anatomy: "Anatomy", phase: str, plugin: bool) -> str:
    """The `ditgate run` command that checks `phase`: the inspected call (every request option), at the smallest
    size where the phase acts when the call's size is too small for it (CP: tokens split over 2/4/8 ranks; VAE-P:
    two VAE tiles; testing: both)."""
    args = list(anatomy.request_args)
    if not args:  # an anatomy built without its Model (analyse on a pipeline in memory): the call's size
        for key, flag in (("height", "--height"), ("width", "--width"), ("num_frames", "--frames")):
            if anatomy.call.get(key) is not None:
                args += [flag, str(anatomy.call[key])]
    size = anatomy.sizes.get({"cp": "cp", "vaep": "vaep", "testing": "both"}.get(phase, ""))
    if size and tuple(size) != (anatomy.sizes.get("height"), anatomy.sizes.get("width")):
        args = plan_call.with_size(args, *size)
    parts = ["ditgate", "run", anatomy.model, "--rows", ",".join(PHASE_ROWS[phase]), *args]
    if plugin:
        parts += ["--integration", PLUGIN]
    return "`" + plan_call.quote(parts) + "`"


def _box(text: str) -> str:
    return f"- [ ] {text}"


def _lists(anatomy: "Anatomy") -> list["BlockList"]:
    return [b for b in anatomy.block_lists if b.called]


def _glance(a: "Anatomy") -> list[str]:
    transformers = ", ".join(f"`{c.name}`: {c.cls}" for c in a.components["transformers"])
    lines = [f"- Pipeline: {a.pipeline.cls} (`{a.pipeline.source_file}`)", f"- Transformer(s): {transformers}"]
    for b in a.block_lists:
        state = b.pattern or "no pattern" if b.called else "not called in the run"
        lines.append(f"- `{b.transformer}.{b.attribute}`: {b.length} x {b.block_class} -> {state}")
    lines.append(f"- Transformer calls per step: {a.calls_per_step:g} -> has_separate_cfg={a.has_separate_cfg}"
                 if a.calls_per_step is not None else "- Transformer calls per step: not measured")
    at = a.attention
    lines.append(f"- Attention: {_n(at.heads)} heads, {_n(at.kv_heads)} KV heads{' (GQA)' if at.gqa else ''}, "
                 f"head_dim {_n(at.head_dim)}; mask reaches attention: {'yes' if at.mask else 'no'}")
    s = a.sequence
    text = f" + {s.text_tokens} text tokens ({'joint' if s.joint else 'not joint'})" if s.text_tokens else ""
    size = call_size(a.call)
    where = f" at {size}" if size else " of the pipeline's default call"
    lines.append(f"- Sequence{where}: {_n(s.image_tokens)} {latent_words(a)}{text}")
    if a.request_args:
        lines.append(f"- The call (every Check command below carries it): `{plan_call.quote(a.request_args)}`")
    if a.sizes:
        lines += plan_call.size_lines(plan_call.Sizes(**{k: tuple(v) if isinstance(v, list) and k != "notes"
                                                         else v for k, v in a.sizes.items()}))
    return lines


def _n(value) -> str:
    """A count for the text: 'unknown' rather than None."""
    return "unknown" if value is None else str(value)


def _cache(a: "Anatomy", adapter: dict[str, Any] | None) -> tuple[list[str], bool]:
    lines = []
    if adapter:
        lists = "; ".join(f"{t}: {', '.join(f'{n} ({p})' for n, p in zip(ls, ps))}" for t, ls, ps in
                          zip(adapter["transformers"], adapter["block_lists"], adapter["forward_patterns"]))
        lines.append(f"cache-dit registers the `{adapter['prefix']}` adapter ({adapter['function']}): {lists}; "
                     f"has_separate_cfg={adapter['has_separate_cfg']}"
                     + (f"; PatchFunctor {adapter['patch_functor']}" if adapter["patch_functor"] else "") + ".")
        lines.append("Check it against the observation below; write a new adapter only where they disagree.")
    else:
        lines.append("cache-dit has no adapter for this pipeline: write a BlockAdapter (in a plugin file for "
                     f"`ditgate run --integration {PLUGIN}`, or registered with `BlockAdapterRegister.register`).")
    called = _lists(a)
    by_transformer: dict[str, list[BlockList]] = {}
    for b in called:
        by_transformer.setdefault(b.transformer, []).append(b)
    lines.append("")
    lines.append("Choices:")
    transformers = list(by_transformer)
    lines.append(f"- transformer={transformers[0] if len(transformers) == 1 else transformers}")
    for t, bs in by_transformer.items():
        lines.append(f"- `{t}` blocks: " + ", ".join(f"`{b.attribute}` -> {b.pattern or 'none'}" for b in bs))
    lines.append(f"- has_separate_cfg={a.has_separate_cfg} (measured transformer calls per step: {a.calls_per_step:g})"
                 if a.calls_per_step is not None else "- has_separate_cfg: not measured")
    check = all(b.check_forward_pattern is not False for b in called)
    lines.append(f"- check_forward_pattern={'True (default for diffusers)' if check else 'False'}")
    functor = [b for b in called if b.patch_functor_needed]
    lines.append("- PatchFunctor: " + ("needed for " + ", ".join(f"`{b.attribute}`" for b in functor)
                                       if functor else "not needed (each loop body is one block call)"))
    lines += plan_traits.cache_lines(a)
    lines.append("")
    lines += [_box("block lists and ForwardPattern confirmed against the block source "
                   "(" + ", ".join(f"{b.attribute}: {b.pattern or 'none'}" for b in called) + ")"),
              _box(f"has_separate_cfg={a.has_separate_cfg} set from the measured calls per step")]
    for b in functor:
        why = "; ".join(b.loop_findings) or b.pattern_reason
        lines.append(_box(f"PatchFunctor for `{b.attribute}`: {why}"))
    lines += [_box("adapter registered (or plugin written); `cache_dit.summary` shows cached steps > 0"),
              _box("cache disabled: output identical to the baseline"),
              _box("cache gate passed")]
    return lines, adapter is None


def _cp(a: "Anatomy", planners: dict[str, Any]) -> tuple[list[str], bool]:
    lines = []
    missing = [t for t, p in planners.items() if p is None]
    for t, p in planners.items():
        lines.append(f"`{t}`: " + (f"cache-dit registers {p}." if p else "no CP planner registered: write one."))
    first = next(iter(_lists(a)), None)
    s, at = a.sequence, a.attention
    lines += ["", "Choices:"]
    if first is not None:
        split = [f"`{first.call['positional'][0] if first.call['positional'] else 'hidden_states'}` (dim 1)"]
        if s.joint and first.encoder_param:
            split.append(f"`{first.encoder_param}` (dim 1; joint attention)")
        if a.traits.interleaved:
            lines.append(f"- {split_points(a.traits, first.attribute)}")
        else:
            lines.append(f"- split at `{first.attribute}.0`: " + ", ".join(split)
                         + " (or at the root `\"\"` if the preprocessing is per-token)")
    for table in s.per_token_tables:
        lines.append(f"- per-token table: {table} -> split its output with the sequence (split_output=True)")
    lines += plan_traits.cp_lines(a)
    if s.gather_candidates:
        lines.append(f"- gather at `{s.gather_candidates[-1]}` (gather_dim=1)")
    else:
        lines.append("- gather: no module after the blocks keeps the image sequence; gather before the output "
                     "projection")
    if at.mask:
        lines.append(f"- attention mask ({'; '.join(at.mask_sources[:3])}): reorder it for the all-to-all layout, "
                     "never split it")
    else:
        lines.append("- no attention mask reaches attention in this run")
    lines += plan_traits.mask_lines(a)
    uaa = [r for r, row in s.divisibility.items() if row["ulysses"] != "ok"]
    lines.append("- divisibility: " + ", ".join(f"{r} ranks {row['ulysses']}" for r, row in s.divisibility.items())
                 + (" -> ulysses-anything where marked" if uaa else ""))
    if at.gqa:
        lines.append("- GQA: repeat K/V to the query heads (enable_gqa=False) under Ulysses, or set cp_gqa_strategy")
    lines.append("")
    lines += [_box("mask search done (also inside joint_attention_kwargs / attention_kwargs)"),
              _box("RoPE / position tables split consistently with the sequence"),
              _box("attention processor routed through cache-dit's `_dispatch_attention_fn`"),
              _box("split and gather points chosen; plan registered with ContextParallelismPlannerRegister "
                   "(or returned by the plugin)"),
              _box("ulysses-2 and ring-2 pass the CP gate; top-left corner and chunk boundaries clean")]
    return lines, bool(missing)


def _tp(a: "Anatomy", planners: dict[str, Any]) -> tuple[list[str], bool]:
    lines = []
    missing = [t for t, p in planners.items() if p is None]
    for t, p in planners.items():
        lines.append(f"`{t}`: " + (f"cache-dit registers {p}." if p else "no TP planner registered: write one."))
    at = a.attention
    lines += ["", "Choices:"]
    tp = ", ".join(f"tp={r}: {'ok' if row['tp'] else 'not divisible'}" for r, row in a.sequence.divisibility.items())
    lines.append(f"- heads {_n(at.heads)}, KV heads {_n(at.kv_heads)}: {tp}")
    lines.append("- per attention module: `shard_div_attr(attn, \"heads\", tp)` when Q/K/V are sharded")
    if at.gqa:
        lines.append("- GQA: shard K/V only when KV heads divide by tp; otherwise FFN-only or Replicate attention")
    if at.fused_qkv:
        lines.append(f"- fused projections {at.fused_qkv[:4]}: un-fuse (or reorder weights per head) before "
                     "Colwise, or keep them replicated")
    if at.qk_norm_across_heads:
        lines.append(f"- QK norm over all heads ({at.qk_norm_across_heads[:2]}): its statistics span the shards")
    lines += plan_traits.tp_lines(a)
    if at.non_pytorch_kernels:
        lines.append(f"- non-PyTorch kernels ({at.non_pytorch_kernels[:3]}): replace with PyTorch ops before "
                     "parallelising (DTensor-unsafe)")
    for cls, rows in a.tp_layers.items():
        lines.append(f"- `{cls}` layers: " + ", ".join(f"{r['layer']} {r['style']}" for r in rows[:16])
                     + (" ..." if len(rows) > 16 else ""))
    lines.append("")
    lines += [_box("layer plan reviewed against the block source (Colwise in, Rowwise out, modulation replicated)"),
              _box("`shard_div_attr` applied wherever the processor reshapes by heads"),
              _box("tp-2 passes the TP gate")]
    return lines, bool(missing)


def _registry_phase(components: list, planners: dict[str, Any], kind: str) -> tuple[list[str], bool | None]:
    """Lines for TE-P or VAE-P; the flag is None when the pipeline has no such component (nothing to check)."""
    if not components:
        return [f"- the pipeline has no {'text encoder' if kind == 'TE-P' else 'VAE'}: nothing to do"], None
    lines = []
    for c in components:
        planner = planners.get(c.name)
        lines.append(f"- `{c.name}` ({c.cls}): " + (f"cache-dit registers {planner}" if planner
                                                    else f"no {kind} planner registered"))
    lines.append("")
    missing = [c for c in components if planners.get(c.name) is None]
    if kind == "TE-P":
        lines.append(_box("text encoder planner present (or written, mirroring the model config's "
                          "`base_model_tp_plan`)"))
        lines.append(_box("tp-2 with the text encoder parallelised passes the TE-P gate"))
    else:
        lines.append(_box("VAE planner present (lookup is by exact class name) or written"))
        lines.append(_box("compared with the *tiled* VAE baseline; passes the VAE-P gate"))
    return lines, bool(missing)


def render(a: "Anatomy") -> str:
    support = a.cache_dit
    out = [f"# Draft integration plan: {a.pipeline.cls}", "",
           f"Derived by `ditgate inspect {a.model}` from one observed run ({a.steps} steps). It is a draft: read "
           "the pipeline and transformer source, correct it, and get it approved before writing code.", "",
           "## Anatomy", *_glance(a), ""]
    if a.warnings:
        out += ["## Warnings", *[f"- {w}" for w in a.warnings], ""]
    phases = [("1. Cache", "cache", _cache(a, support["adapter"])),
              ("2. Context parallelism (CP)", "cp", _cp(a, support["cp_planners"])),
              ("3. Tensor parallelism (TP)", "tp", _tp(a, support["tp_planners"])),
              ("4. Text-encoder parallelism (TE-P)", "tep",
               _registry_phase(a.components["text_encoders"], support["text_encoder_planners"], "TE-P")),
              ("5. VAE parallelism (VAE-P)", "vaep",
               _registry_phase(a.components["vaes"], support["vae_planners"], "VAE-P"))]
    plugin = False
    for title, key, (lines, needs_plugin) in phases:
        plugin = plugin or bool(needs_plugin and key in ("cache", "cp", "tp"))
        check = [] if needs_plugin is None else [f"Check: {run_command(a, key, plugin)}"]
        out += [f"## {title}", *lines, *check, ""]
    examples = support["cli_examples"]
    out += ["## 6. CLI (`cache-dit-generate`)",
            f"cache-dit examples using {a.pipeline.cls}: {', '.join(examples)}." if examples else
            f"No cache-dit example uses {a.pipeline.cls}: register one with `ExampleRegister.register(name, "
            "default=...)` and map its model-path environment variable.",
            _box("example registered and listed by `cache-dit-generate list`"), "",
            "## 7. Testing",
            _box("every row of the matrix passes its gate; results table (latency, PSNR, SSIM, memory) recorded"),
            _box("video: per-frame minimum checked, not only the mean") if a.call.get("num_frames") else
            _box("images inspected side by side with the baseline (grid)"),
            f"Check: {run_command(a, 'testing', plugin)}", ""]
    return "\n".join(out)
