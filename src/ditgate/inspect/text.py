"""The anatomy as text: short sections, each a small table (what `ditgate inspect` prints)."""

from __future__ import annotations

from ditgate.inspect.model import latent_words, serves


def _table(headers: list[str], rows: list[list]) -> list[str]:
    cells = [[str(c) if c is not None else "-" for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)]


def _yes(value) -> str:
    return {True: "yes", False: "no", None: "-"}.get(value, str(value))


def _signature(block) -> str:
    params = []
    for p in block.signature:
        name = {"var_positional": "*", "var_keyword": "**"}.get(p.kind, "") + p.name
        params.append(name + ("=..." if p.has_default else ""))
    return f"{block.block_class}.forward({', '.join(params)})" + (f" -> {block.returns}" if block.returns else "")


def _traits(a) -> list[str]:
    """What the blocks were seen doing (`Anatomy.traits`), one line each."""
    t = a.traits
    lines = [f"  mask: {line}" for line in t.mask_lines]
    if t.weak_mask:
        lines.append("  ! every mask was nearly all True: a mask fault would not show in this run")
    lines += [f"  reaches every block of {i['list']} unchanged: {i['argument']} {i['shape']} (dim {i['dim']} "
              f"sequence-long; {'made by ' + i['made_by'] if i['made_by'] else 'built in forward'})"
              for i in t.per_block_tensors]
    lines += [f"  interleaved block lists: {first} and {second}" for first, second in t.interleaved]
    lines += [f"  chunked modulation: {name}" for name in t.chunked_modulation]
    lines += [f"  fused gated MLP: {name}" for name in t.gated_mlps]
    lines += [f"  packed parameter: {p['parameter']} {p['shape']}" for p in t.packed_parameters]
    lines += [f"  ! CP hazard, routing over the whole sequence: {note}" for note in t.sequence_routing]
    lines += [f"  expert layer: {e['layer']} (blocks {e['blocks']}): {e['experts']} experts, router {e['router']}, "
              f"shared {', '.join(e['shared']) or 'none'}, routing {e['routing']}" for e in t.experts]
    lines += [f"  block structures of {name}: " + "; ".join(f"{r['blocks']}: {', '.join(r['sublayers'])}" for r in rows)
              for name, rows in t.block_variants.items()]
    lines += [f"  norm inside attention: {name} ({kind})" for name, kind in t.attention_norms.items()]
    lines += [f"  called {n} times per forward: {name}" for name, n in t.repeated_modules.items()]
    lines += [f"  long skip: {note}" for note in t.long_skips]
    lines += [f"  runs outside its block: {note}" for note in t.outside_calls]
    counted = {k: v for k, v in t.calls_per_step.items() if v is not None}
    if len(counted) > 1:
        lines.append("  calls per step: " + ", ".join(f"{k} {v:g}" for k, v in counted.items()))
    return (["Traits (observed)"] + lines + [""]) if lines else []


def render(a) -> str:
    """The human report: short sections, each a small table."""
    shown = (f"{k}={v if isinstance(v, (bool, int, float, str, list)) else type(v).__name__}"
             for k, v in a.call.items() if k != "prompt")
    out = [f"{a.model}: {a.pipeline.cls}  ({a.pipeline.source_file})",
           f"observed run: {a.steps} steps, " + ", ".join(shown), ""]

    out.append("Components")
    rows = [[role.rstrip("s").replace("_", " "), c.name, c.cls, c.source_file]
            for role, items in a.components.items() for c in items]
    out += _table(["role", "name", "class", "source"], rows) + [""]

    if getattr(a, "modular", None):
        out += _modular(a.modular)
    out.append("Block lists")
    rows = [[f"{b.transformer}.{b.attribute}", b.length, b.block_class,
             " + ".join("H" if r == "hidden_states" else "E" if r == "encoder_hidden_states" else "?"
                        for r in b.outputs or []) or "-", b.pattern, _yes(b.check_forward_pattern),
             _yes(b.patch_functor_needed) if b.called else "not called"] for b in a.block_lists]
    out += _table(["list", "n", "block class", "returns", "pattern", "name check", "PatchFunctor"], rows)
    for b in a.block_lists:
        out.append(f"  {_signature(b)}")
        if b.called:
            out.append(f"    {b.pattern_reason}")
        out += [f"    ! {finding}" for finding in b.loop_findings]
    out += [f"  {finding}" for finding in a.between_lists] + [""]

    by_step = f" (per step: {', '.join(map(str, a.calls_by_step))})" if a.calls_by_step else ""
    calls = f"{a.calls_per_step:g}" if a.calls_per_step is not None else "?"
    out.append(f"Transformer calls per step: {calls}{by_step} -> has_separate_cfg = {a.has_separate_cfg}")
    out += [f"  {serves(a, t)}" for t in a.transformer_calls if len(a.transformer_calls) > 1] + [""]

    at = a.attention
    out.append("Attention")
    rows = [[f"{g.transformer}.{g.group}", g.cls, g.processor, g.heads, g.kv_heads, g.head_dim, g.kind,
             f"{g.q_len}/{g.kv_len}" if g.q_len else "-", _yes(g.mask)] for g in at.groups]
    out += _table(["module", "class", "processor", "heads", "kv", "head_dim", "kind", "q/kv len", "mask"], rows)
    out.append(f"  GQA: {_yes(at.gqa)}; mask reaches attention: {_yes(at.mask)}"
               + (f" ({'; '.join(at.mask_sources)})" if at.mask_sources else ""))
    out.append(f"  fused QKV: {', '.join(at.fused_qkv) or 'none'}; non-PyTorch kernels: "
               f"{'; '.join(at.non_pytorch_kernels) or 'none'}")
    if at.qk_norm_across_heads:
        out.append(f"  QK norm over all heads: {', '.join(at.qk_norm_across_heads)}")
    out.append("")

    s = a.sequence
    out.append("Sequence")
    text = f"text tokens {s.text_tokens}" if s.text_tokens is not None else "no text stream entering the blocks"
    out.append(f"  {latent_words(a)} {s.image_tokens if s.image_tokens is not None else 'unknown'}, {text}, "
               f"{'joint attention over ' + str(s.attention_tokens) + ' tokens' if s.joint else 'no joint attention'}"
               f"; batch {a.batch if a.batch is not None else 'unknown'}")
    rows = [[r, _yes(d["image_tokens"]), _yes(d["text_tokens"]), _yes(d["heads"]), _yes(d["kv_heads"]),
             d["ulysses"], _yes(d["ring"]), _yes(d["tp"])] for r, d in s.divisibility.items()]
    out += _table(["ranks", f"{latent_words(a).split()[0]} % n", "text % n", "heads % n", "kv % n", "ulysses", "ring", "tp"], rows)
    out += [f"  per-token table: {t}" for t in s.per_token_tables]
    if s.gather_candidates:
        out.append(f"  after the blocks, still image-sequence long: {', '.join(s.gather_candidates)}")
    out.append("")

    out += _traits(a)

    c = a.cache_dit
    out.append(f"cache-dit {c['cache_dit_version']} provides")
    adapter = c["adapter"]
    adapter_text = (f"{adapter['prefix']} ({adapter['function']}): "
                    + "; ".join(f"{', '.join(ls)} -> {', '.join(ps)}"
                                for ls, ps in zip(adapter["block_lists"], adapter["forward_patterns"]))
                    + f"; has_separate_cfg={adapter['has_separate_cfg']}"
                    + (f"; {adapter['patch_functor']}" if adapter["patch_functor"] else "")) if adapter \
        else (c["adapter_error"] or "none")
    rows = [["BlockAdapter", a.pipeline.cls, adapter_text]]
    rows += [["CP planner", n, p or "none"] for n, p in c["cp_planners"].items()]
    rows += [["TP planner", n, p or "none"] for n, p in c["tp_planners"].items()]
    rows += [["TE-P planner", n, p or "none"] for n, p in c["text_encoder_planners"].items()]
    rows += [["VAE-P planner", n, p or "none"] for n, p in c["vae_planners"].items()]
    rows += [["CLI example", a.pipeline.cls, ", ".join(c["cli_examples"]) or "none"]]
    out += _table(["what", "for", "provided"], rows) + [""]

    if a.warnings:
        out.append("Warnings")
        out += [f"  ! {w}" for w in a.warnings] + [""]
    return "\n".join(out)


def _modular(m: dict) -> list[str]:
    """The pipeline blocks of a ModularPipeline: which sub-block holds the denoise loop, the guider, the output."""
    out = ["Pipeline blocks (ModularPipeline)"]
    rows = [["  " * r["depth"] + r["path"].rsplit(".", 1)[-1], r["class"], r["kind"], _yes(r.get("runs")),
             ", ".join(r["components"]) or "-", "denoise loop" if r["denoise_loop"] else ""] for r in m["blocks"]]
    out += _table(["block", "class", "kind", "runs", "components", ""], rows)
    g = m["guider"]
    guider = (f"{g['class']} (enabled {_yes(g['enabled'])}, scale {g['guidance_scale']}, schedule "
              f"{g['start']}-{g['stop']})" if g else "none")
    out.append(f"  denoise loop of this call: {m['denoise_loop'] or 'none found'}; guider: {guider} -> "
               f"{m['expected_calls_per_step']} transformer call(s) per step")
    out.append(f"  output read by name: {m['output']} ({m['modality']}); the blocks declare "
               f"{', '.join(m['outputs']) or 'none'}")
    return out + [""]
