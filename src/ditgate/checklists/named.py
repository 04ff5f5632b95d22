"""Named checks: checklist items that are neither one runner row nor one inspect fact.

A checklist item `check: {kind: named, name: NAME, args: {...}}` runs the check `NAME` of `CHECKS`, the one
registry. Each check says what it needs: the inspect anatomy of the model, the loaded pipeline, extra runner rows
(batched into the checklist's single runner call) or a pipeline it may change (run last, on a fresh load). Each
returns an `Outcome`: pass or fail with the evidence, in words. A check that cannot be evaluated raises; the
checklist records that item as an error.
"""

from __future__ import annotations


from ditgate.checklists.context import Arg, NamedCheck
from ditgate.checklists.checks_model import cp_plan_consistent, extra_module_planner, model_contract, model_folder
from ditgate.checklists.checks_cache import _all_steps_row, _rerun_row, baseline_reproducible, cache_off_identical, forward_pattern_matches, integration_provides, patch_functor_when_needed, separate_cfg_matches































































CHECKS: dict[str, NamedCheck] = {c.name: c for c in (
    NamedCheck("integration-provides", "the integration file defines HOOK, or cache-dit registers one for the class",
               integration_provides, {"hook": Arg(choices=("block_adapter", "cp_plan", "tp_plan"), required=True)},
               anatomy=True),
    NamedCheck("forward-pattern-matches", "each block list's declared ForwardPattern is the one inspect observed",
               forward_pattern_matches, anatomy=True, pipe=True),
    NamedCheck("separate-cfg-matches", "the has_separate_cfg cache-dit will use matches the observed calls per step",
               separate_cfg_matches, anatomy=True, pipe=True),
    NamedCheck("patch-functor-when-needed", "a block loop that does more than call blocks has a PatchFunctor",
               patch_functor_when_needed, anatomy=True, pipe=True),
    NamedCheck("cache-off-identical", "with the cache applied but every step computed, the output equals the baseline",
               cache_off_identical, rows=_all_steps_row),
    NamedCheck("baseline-reproducible", "a second baseline run equals the first", baseline_reproducible,
               rows=_rerun_row),
    NamedCheck("cp-plan-consistent", "the CP plan's keys and inputs exist, and what it splits it also gathers",
               cp_plan_consistent, {"ranks": Arg(kind=int, default=2)}, pipe=True, mutates=True),
    NamedCheck("extra-module-planner", "cache-dit has a planner for the module 'text_encoder' or 'vae' resolves to",
               extra_module_planner, {"module": Arg(choices=("text_encoder", "vae"), required=True)}, pipe=True),
    NamedCheck("model-contract", "DiffusionPipeline, ModelMixin transformers, block lists, _repeated_blocks, "
               "diffusers attention classes", model_contract, pipe=True),
    NamedCheck("model-folder", "model_index.json and every component folder it names, with weights", model_folder),
)}
