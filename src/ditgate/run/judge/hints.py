"""What to look at first when a row of a phase fails (shown next to its error in the report)."""

HINTS = {
    "cache": "check the BlockAdapter: the block lists, each list's ForwardPattern (the order of the block's "
             "outputs: `ditgate inspect MODEL` observes it) and has_separate_cfg (transformer calls per step)",
    "cp": "check the CP plan: every sequence tensor split at the entry needs a gather (_ContextParallelOutput) before "
          "the output projection; attention masks are reordered, never split; all ranks must see the same RoPE grid",
    "tp": "check the TP plan: when Q/K/V are sharded the head count must be divided (shard_div_attr), every "
          "ColwiseParallel needs its RowwiseParallel partner, and tensors concatenated with DTensors must be DTensors",
    "tep": "check that cache-dit has a text-encoder TP planner for this encoder class (`ditgate inspect MODEL`)",
    "vaep": "check that cache-dit has a VAE planner for this exact VAE class and that the VAE supports tiling",
    "hybrid": "make CP and TP pass on their own first; hybrid needs at least 4 ranks",
    "compile": "look for graph breaks and recompiles (TORCH_LOGS=graph_breaks,recompiles); a row with compile "
               "options {regional: false} or {backend: aot_eager} tells the model's code from inductor's",
    "quantization": "check which layers cache-dit quantized (QuantizeConfig verbose=True) and exclude sensitive "
                    "ones (exclude_layers)",
}

_COMPONENT_WORDS = {  # words in an error that name the component it came from, and the phase whose hint applies
    "tep": ("text_encoder", "textencoder", "t5encoder", "clip", "umt5", "qwen2_5_vl", "text-encoder"),
    "vaep": ("vae", "autoencoder", "decoder"),
}


# A group stopped for making no progress: no plan produced wrong numbers, a rank waits where the others are not.
HANG_HINT = ("a rank hung (no progress for --timeout seconds): every rank must reach the same collectives in the same "
             "order; at the stage each rank stopped (named above), look for a branch only some ranks take (rank == 0, "
             "a data-dependent shape or early exit), a rank that is still loading, or raise --timeout for a model "
             "this slow")


# cache-dit's own refusal of a configuration larger than the model (cache_dit/caching/cache_blocks/pattern_base.py):
# the adapter is not at fault, the preset is.
TOO_FEW_BLOCKS = "must be less than the number of transformer blocks"
TOO_FEW_BLOCKS_HINT = ("the cache configuration computes more front/back blocks (Fn_compute_blocks + "
                       "Bn_compute_blocks) than a block list of this model has: not an adapter fault; choose smaller "
                       "ones, e.g. `--cache-config Fn_compute_blocks=1 Bn_compute_blocks=0` or the cache-fast preset")


def hint_for(phase: str | None, message: str, error: dict | None = None) -> str:
    """The hint that applies to this failure, or "": none for a row refused before it ran or a rank that died
    outside Python (a signal: the memory killer or a native crash, where no plan is at fault); for a group that hung
    the hang's (no plan produced wrong numbers: HANG_HINT); for TE-P / VAE-P
    rows the hint of the component the error names (a transformer without a TP planner is told about TP)."""
    error = error or {}
    if not phase or error.get("preflight") or " was killed by SIG" in message:
        return ""
    if error.get("timed_out") or message.startswith("no progress for the timeout"):
        return HANG_HINT
    if TOO_FEW_BLOCKS in message:
        return TOO_FEW_BLOCKS_HINT
    if phase in ("tep", "vaep"):
        lowered = message.lower()
        named = [p for p, words in _COMPONENT_WORDS.items() if any(w in lowered for w in words)]
        if phase not in named:
            return HINTS["tp"] if "transformer" in lowered or not named else HINTS[named[0]]
    return HINTS.get(phase, "")


TUNING_MARK = "try a stricter threshold"  # in the one piece of advice that tunes the cache (ditgate.run.judge.volatility)


def ranked(verdict: dict, reasons: list[str], record: dict) -> list[str]:
    """A failing cache row's reasons, the strongest evidence first. The caching-off check failing proves the
    adapter or a functor changes the model: that comes first and no cache tuning is advised (it cannot help). Else,
    when only the latents fail while the output passes, advice to tune the cache follows the gate's reasons (a row
    whose residuals are too volatile for any cache becomes inconclusive instead: ditgate.run.judge.volatility)."""
    off = verdict.get("cache_off") or {}
    if off and not off.get("passed"):
        first = [r for r in reasons if r.startswith(off.get("detail", "\0"))]
        return first + [r for r in reasons if r not in first]
    return reasons + _latents_only_hint(record) if not record.get("passed") else reasons


def _latents_only_hint(record: dict) -> list[str]:
    """What to try when a cache row fails on its latents alone while its output passes (`record`: a verdict's
    dict)."""
    from ditgate.gates.verdicts import METRICS

    latent = {*METRICS["latent"], "disp_rel_error"}
    failed = [c for c in record.get("checks", []) if not c["passed"]]
    if not failed or any(c["metric"] not in latent for c in failed):
        return []
    return [("only the latents fail while the output passes: this model's residuals change too fast for this cache "
            f"configuration; {TUNING_MARK} (--cache-config residual_diff_threshold=0.04), more warm-up "
            "steps (--cache-config max_warmup_steps=4), more computed blocks (--cache-config Fn_compute_blocks=2) "
            "or a calibrator (--cache-config taylorseer=1), and keep the one whose latents pass")]
