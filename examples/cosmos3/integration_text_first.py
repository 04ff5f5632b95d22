"""A planted fault: Cosmos 3 distilled's layers cached as they come, the text stream first (no patch functor).

The layers take `(und_seq, gen_seq, ...)`; as Pattern_0 cache-dit then takes the text ("understanding") stream
for `hidden_states` and decides on its residual. That stream attends causally to text tokens only, so it is the same
at every step: its residual diff is exactly 0 and, under a residual threshold, every step after the warm-up is
cached whatever the vision tokens do. Measured on zoo:cosmos3-distilled (`--rows baseline,cache --cache-config
mask=null residual_diff_threshold=0.2 max_warmup_steps=1`): residual diffs 0.0, 0.0, 0.0, steps 1-3 cached, the
cache row fails on its latents (0.055 against 0.05); integration.py (vision stream first) diffs 0.10, 0.24, 0.16,
steps 1 and 3 cached, the row passes. The default static schedule caches the same steps either way and does not
show it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import cache_dit

_spec = importlib.util.spec_from_file_location("cosmos3_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

cp_plan = _good.cp_plan
tp_plan = _good.tp_plan


def block_adapter(pipe):
    transformer = pipe.transformer
    return cache_dit.BlockAdapter(pipe=pipe, transformer=transformer, blocks=transformer.layers,
                                  forward_pattern=cache_dit.ForwardPattern.Pattern_0, check_forward_pattern=False,
                                  has_separate_cfg=False)
