"""A small, complete skill written into a temporary folder: the linter's clean case, and the base every
planted fault edits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "cache-dit-model-integration"

SKILL_MD = """\
---
name: cache-dit-model-integration
description: Integrate a new diffusion transformer into cache-dit one gated phase at a time (cache, context, tensor,
  text-encoder and VAE parallelism), each phase checked against the single-device baseline.
license: Apache-2.0
metadata:
  version: "1"
---
# cache-dit model integration

## Route first
1. Integrating a new model: follow the phases below in order.
2. The model is audio-only: read [audio](references/audio.md) when the pipeline returns a waveform.

## Phases
| phase | read | checklist | gate |
|---|---|---|---|
| Cache | [cache.md](references/cache.md) | `checklists/cache.yaml` | PSNR > 30 dB and SSIM > 0.90 |
| CP | [cp.md](references/cp.md) | `checklists/cp.yaml` | PSNR > 35 dB and SSIM > 0.90 |
| TP | [tp.md](references/tp.md) | `checklists/tp.yaml` | PSNR > 35 dB and SSIM > 0.90 |
| TE-P | [tep.md](references/tep.md) | `checklists/tep.yaml` | PSNR > 35 dB and SSIM > 0.90 |
| VAE-P | [vaep.md](references/vaep.md) | `checklists/vaep.yaml` | PSNR > 35 dB and SSIM > 0.90 |

Exact phases in float32 also need max-abs ≤ 1e-4 against the baseline; a worst-tile SSIM > 0.80 catches a broken
region. Measured on the tiny Flux: 33.8 dB. The notebooks (`notebooks/20_cache.ipynb` ...) run the same checks.

## Cache in three lines
```python
import cache_dit
from cache_dit import BlockAdapter, DBCacheConfig, ForwardPattern

adapter = BlockAdapter(pipe=pipe, transformer=pipe.transformer, blocks=pipe.transformer.transformer_blocks,
                       forward_pattern=ForwardPattern.Pattern_1)
cache_dit.enable_cache(adapter, cache_config=DBCacheConfig(Fn_compute_blocks=1))
```
`ForwardPattern.Pattern_0` returns hidden states first. The gate table is
[gates.json](checklists/gates.json); see [the phases](#phases).

```bash runnable
ditgate lint --json
ditgate skill install --target "$PROJECT" --layout all \\
    --force
```
"""

REFERENCES = {
    "cache": "# Cache\n\n## Gate\nA cached run passes with PSNR > 30 dB and SSIM > 0.90 against the uncached one.\n"
             "Then go to [context parallelism](cp.md#gate).\n",
    "cp": "# Context parallelism\n\n## Gate\nUlysses and ring both need PSNR > 35 dB and SSIM > 0.90.\n"
          "Back to the [cache gate](cache.md#gate).\n",
    "tp": "# Tensor parallelism\n\nPSNR > 35 dB, SSIM > 0.90, max-abs ≤ 1e-4.\n",
    "tep": "# Text-encoder parallelism\n\nSame gate as TP: PSNR > 35 dB.\n",
    "vaep": "# VAE parallelism\n\nCompare with the tiled baseline: PSNR > 35 dB.\n",
    "audio": "# Audio models\n\nGates come from a rerun: mel PSNR ≥ 21 dB, mel SSIM ≥ 0.75, SI-SDR ≥ −5 dB.\n",
}

PHASE_NOTEBOOKS = {"cache": "20_cache", "cp": "30_cp", "tp": "40_tp", "tep": "50_tep", "vaep": "60_vaep"}


def write_skill(parent: Path, name: str = NAME) -> Path:
    """Write the clean skill into `parent/name` and return that folder."""
    root = parent / name
    (root / "references").mkdir(parents=True)
    (root / "checklists").mkdir()
    (root / "notebooks").mkdir()
    (root / "SKILL.md").write_text(SKILL_MD, encoding="utf-8")
    for ref, text in REFERENCES.items():
        (root / "references" / f"{ref}.md").write_text(text, encoding="utf-8")
    shutil.copy(ROOT / "checklists" / "gates.json", root / "checklists" / "gates.json")
    notebook = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    for phase, stem in PHASE_NOTEBOOKS.items():
        (root / "checklists" / f"{phase}.yaml").write_text(f"phase: {phase}\nsteps: []\n", encoding="utf-8")
        (root / "notebooks" / f"{stem}.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    return root


def edit(path: Path, old: str, new: str) -> None:
    """Replace `old` (which must occur) with `new` in a file."""
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
