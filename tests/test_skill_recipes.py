"""The recipe examples the skill cites (examples/recipes/): each one matches the unsplit computation with its key
step and fails without it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"


def recipe(name: str):
    """Import examples/recipes/NAME.py under its own name: mp.spawn's children import the worker by module name,
    and they inherit this sys.path."""
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    return importlib.import_module(name)


def test_fused_qkv_tp_relayout_and_replicate_match_a_plain_shard_does_not():
    results = recipe("fused_qkv_tp").run(("relayout", "replicate", "plain", "plain-sizes"))
    assert results["relayout"][0] and results["replicate"][0], results
    assert not results["plain"][0] and "max-abs" in results["plain"][1], results       # wrong numbers, no error
    assert not results["plain-sizes"][0] and "split_with_sizes" in results["plain-sizes"][1], results


def test_mask_reorder_pre_hook():
    module = recipe("mask_reorder")
    for full in (True, False):
        for world in (2, 4):
            assert module.check(with_hook=True, world=world, full=full) < 1e-5
        assert module.check(with_hook=False, world=2, full=full) > 0.1


def test_chunk_and_concatenate_equals_the_permutation():
    import torch

    module = recipe("mask_reorder")
    keys = module.padded_text_mask(12, 5, 16, full=False)
    image_first = torch.cat([keys[..., 12:], keys[..., :12]], dim=-1)
    perm = module.ulysses_order(12, 16, 2, text_first=False)
    assert torch.equal(module.chunk_cat_key_mask(image_first, 16, 2), module.reorder_mask(image_first, perm))


def test_rope_global_grid_slice():
    errors = recipe("rope_global_slice").run((False, True))
    assert errors[True] == 0.0 and errors[False] > 0.1, errors


def test_recipes_run_as_scripts_from_elsewhere(tmp_path):
    ok = subprocess.run([sys.executable, str(RECIPES / "mask_reorder.py")], cwd=tmp_path, capture_output=True,
                        text=True, timeout=300)
    bad = subprocess.run([sys.executable, str(RECIPES / "mask_reorder.py"), "--without-hook"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "matches one process" in ok.stdout, ok.stdout + ok.stderr
    assert bad.returncode == 1 and "WRONG" in bad.stdout, bad.stdout + bad.stderr


def test_the_practice_integration_file_is_the_one_testing_md_shows():
    from ditgate.core.plugin import load

    text = (ROOT / "references" / "testing.md").read_text(encoding="utf-8")
    start = text.index("```python\n# flux_as_new.py")
    fence = text[start:text.index("```\n", start + 10)].split("\n")[3:]       # drop the fence line and 2 comments
    path = ROOT / "examples" / "plugins" / "flux_as_new.py"
    code = path.read_text(encoding="utf-8")
    assert code.endswith("\n".join(fence)), "examples/plugins/flux_as_new.py differs from the file testing.md shows"
    integration = load(path)
    assert all(getattr(integration, hook) is not None for hook in ("block_adapter", "cp_plan", "tp_plan"))
