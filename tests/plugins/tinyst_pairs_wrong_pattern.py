"""Broken on purpose: TinyST's list of spatial/temporal pairs (examples/tinyst/integration.py) declared Pattern_0.

A pair takes and returns `hidden_states` only (Pattern_3); Pattern_0 is the pattern of a joint block that returns
`(hidden_states, encoder_hidden_states)`, a guess from the model family. The forward-pattern check, which observes
the pairs after `block_adapter` built them, must fail it.
"""

import importlib.util
from pathlib import Path

import cache_dit

_path = Path(__file__).resolve().parents[2] / "examples" / "tinyst" / "integration.py"
_spec = importlib.util.spec_from_file_location("tinyst_integration_pairs_pattern0", _path)
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)


def block_adapter(pipe):
    transformer = _good.patch_pairs(pipe.transformer)
    return cache_dit.BlockAdapter(
        pipe=pipe, transformer=transformer, blocks=transformer.st_pairs,
        forward_pattern=cache_dit.ForwardPattern.Pattern_0, check_forward_pattern=False, has_separate_cfg=False)
