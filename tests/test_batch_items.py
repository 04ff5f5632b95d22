"""A batch of prompts is compared item by item, and the report says so.

`ditgate.run.exec.outputs.further` gives every sample after the first as a further output (`images_item2`, ...),
gated against the baseline's same item by `ditgate.run.judge.outputs`; report.md says "batch of N: every item
compared". Full tier: zoo:tinymm with two prompts of different lengths passes cache and cp-ulysses-2 with both items
gated; tests/plugins/tinymm_mask_one_per_branch.py (a mask built from each guidance branch's first prompt: the
second prompt's padding is wrong) fails cp-ulysses-2 naming the second item, whose first item matches.
"""

import json

import numpy as np
import pytest
from PIL import Image

from ditgate.run.exec.outputs import decoded, further

PROMPTS = '["a red cube on a table", "a small blue sphere floating above a wooden floor at dusk"]'


def test_every_item_after_the_first_is_a_further_output():
    from diffusers.pipelines.flux.pipeline_output import FluxPipelineOutput

    first = Image.fromarray(np.zeros((8, 8, 3), np.uint8))
    second = Image.fromarray(np.full((8, 8, 3), 255, np.uint8))
    out = FluxPipelineOutput(images=[first, second])
    image, modality = decoded(out)
    extra = further(out)
    assert modality == "image" and image.max() == 0 and set(extra) == {"images_item2"}
    assert extra["images_item2"]["output"].min() == 1.0 and extra["images_item2"]["of"] == 2
    video = np.zeros((2, 3, 8, 8, 3), np.float32)  # [B, F, H, W, C] as an array: items named after `output`
    video[1] += 0.5
    extra = further(video)
    assert set(extra) == {"output_item2"} and extra["output_item2"]["output"].shape == (3, 8, 8, 3)
    assert further(np.zeros((1, 8, 8, 3), np.float32)) == {}  # a batch of one adds nothing


@pytest.mark.full
def test_two_prompts_are_gated_item_by_item(tmp_path, run_cli):
    from pathlib import Path

    good = Path(__file__).resolve().parents[1] / "examples" / "tinymm" / "integration.py"
    bad = Path(__file__).parent / "plugins" / "tinymm_mask_one_per_branch.py"
    code, out, err = run_cli("run", "zoo:tinymm", "--call", f"prompt={PROMPTS}", "--rows", "cache,cp-ulysses-2",
                             "--integration", good, "--out", tmp_path / "good", "--json")
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    assert code == 0, err[-3000:]
    for name in ("cache", "cp-ulysses-2"):
        item = rows[name]["verdict"]["outputs"]["images_item2"]
        assert item["judged"] and item["passed"] and item["item"] == 2 and item["of"] == 2
    assert "- batch of 2: every item compared" in (tmp_path / "good" / "report.md").read_text()
    code, out, err = run_cli("run", "zoo:tinymm", "--call", f"prompt={PROMPTS}", "--rows", "cp-ulysses-2",
                             "--integration", bad, "--out", tmp_path / "bad", "--json", "--no-diff")
    row = next(r for r in json.loads(out)["rows"] if r["name"] == "cp-ulysses-2")
    assert code == 1 and row["metrics"]["psnr"] > 100  # the first item matches
    assert any(r.startswith("images_item2 output (image)") for r in row["reasons"]), row["reasons"]
