"""More prompts and seeds for the lossy rows (`--prompts FILE`, `--seeds N` on run and matrix).

A lossy row (a cache or quantization row: its phase's gate is not exact) judged on one prompt and one seed may pass
by luck; cache-dit's own quality numbers are measured over a prompt set. `expand` adds, for each lossy row whose
baseline is a reference row, one copy of the row and one of its baseline per further (prompt, seed): `cache@p1s0`
against `baseline@p1s0`, ... (p0 is the request's own prompt; the seeds run from the request's seed up). Each copy
runs and is gated like any row; `ditgate.run.judge.variants.fold` then puts every gate of the row on its worst
case and records the spread.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.run.define.rows import Row

SEP = "@"  # between a row's name and its variant's tag: cache@p1s0


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: a JSON or YAML list of strings, else one prompt per line (blank lines and lines starting
    with # skipped)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DitgateError(f"prompts file {path} does not exist") from None
    prompts: Any = None
    if path.suffix.lower() in (".json", ".yaml", ".yml"):
        import yaml

        try:
            prompts = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise DitgateError(f"prompts file {path}: not valid {path.suffix[1:].upper()}: {exc}") from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) and p.strip() for p in prompts):
            raise DitgateError(f"prompts file {path}: expected a list of non-empty strings")
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        raise DitgateError(f"prompts file {path} holds no prompt")
    return prompts


def is_lossy(row: Row, gates: dict) -> bool:
    return bool(row.phase) and not gates["phases"].get(row.phase, {}).get("exact", True)


def expand(rows: list[Row], prompts: list[str] | None, seeds: int, seed: int, gates: dict) -> list[Row]:
    """`rows` plus the variant rows of each lossy row (see the module's doc); `seed` is the request's seed, `gates`
    the gate table (which phases are exact)."""
    if seeds < 1:
        raise DitgateError(f"--seeds must be at least 1, got {seeds}")
    prompts = list(prompts or [])
    if not prompts and seeds == 1:
        return list(rows)
    by_name = {r.name: r for r in rows}
    tags = [(i, p, s) for i, p in enumerate([None, *prompts]) for s in range(seed, seed + seeds) if (i, s) != (0, seed)]
    out, added = list(rows), set(by_name)
    for row in rows:
        base = by_name.get(row.baseline or "")
        if not is_lossy(row, gates) or base is None or base.phase is not None:
            continue
        for i, prompt, s in tags:
            tag = f"p{i}s{s}"
            base_v = dataclasses.replace(base, name=f"{base.name}{SEP}{tag}",
                                         variant={"of": base.name, "prompt": prompt, "seed": s},
                                         description=f"{base.name} on prompt {i}, seed {s}")
            row_v = dataclasses.replace(row, name=f"{row.name}{SEP}{tag}", baseline=base_v.name, also_against=None,
                                        variant={"of": row.name, "prompt": prompt, "seed": s},
                                        description=f"{row.name} on prompt {i}, seed {s}")
            for new in (base_v, row_v):
                if new.name not in added:
                    out.append(new)
                    added.add(new.name)
    return out
