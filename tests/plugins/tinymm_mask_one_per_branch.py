"""Broken on purpose: TinyMM's CP integration (examples/tinymm/integration.py) with one mask per guidance branch.

The processor builds the joint mask from the first prompt of each classifier-free-guidance branch and repeats it
over the branch, as code that assumes every prompt of a batch has the same length would. A call with one prompt is
unaffected (the CP row passes); with a batch of two prompts of different lengths the first prompt's output stays
right and the second prompt's text padding is wrong, so only the second item of the batch differs from the
baseline. A report that compared the first item alone passed it.
"""

import importlib.util
from pathlib import Path

import torch

_path = Path(__file__).resolve().parents[2] / "examples" / "tinymm" / "integration.py"
_spec = importlib.util.spec_from_file_location("tinymm_integration_one_mask", _path)
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


class OneMaskPerBranch(_good.GatheredMask):
    def get(self, mask, text_len, image_len, cp_config):
        half = mask.shape[0] // 2  # [negatives..., prompts...]: each branch's first sample, repeated
        firsts = torch.tensor([0] * half + [half] * (mask.shape[0] - half), device=mask.device)
        return super().get(mask.index_select(0, firsts), text_len, image_len, cp_config)


def cp_plan(transformer, parallelism_config):
    masks = OneMaskPerBranch()
    for block in transformer.transformer_blocks:
        block.attn.set_processor(_good.ParallelJointAttnProcessor(masks))
    return _good.context_parallel_plan(transformer)  # keeps the processors set above
