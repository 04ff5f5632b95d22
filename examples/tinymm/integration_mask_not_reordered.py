"""Broken on purpose: TinyMM's integration with the attention mask passed to attention in its original order.

Everything else is `integration.py`: the same split points, the same RoPE handling, the dispatching processor. Under
Ulysses the attention sees the sequence as `[text_0, image_0, text_1, image_1]`, while the mask still describes
`[text, image]`. The mask rows of the text padding then fall on the first image tokens of rank 0 (the top rows of
the picture), which attend only to the first text token, and the text padding of rank 1 becomes visible to every
query. `ditgate run zoo:tinymm --rows cp-ulysses-2 --integration THIS_FILE` fails the CP gate with "a region is
corrupted" while the global SSIM still passes.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tinymm_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


def cp_plan(transformer, parallelism_config):
    return _good.context_parallel_plan(transformer, reorder_mask=False)
