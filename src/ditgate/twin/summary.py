"""What a twin is: the `Twin` record `build` and `cached` return, stored in the twin's `ditgate.json` under
"twin", and printed by `ditgate twin` (text, or the same as JSON with `--json`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Twin:
    folder: Path
    source: str  # the source folder (or zoo spec) it was built from
    pipeline_class: str
    components: list[dict[str, Any]]  # per component: name, class, action, cuts, changes, params, notes
    params: int
    bytes: int
    call: dict[str, Any]
    vae_tiling: dict[str, Any] = field(default_factory=dict)
    modality: str = "image"
    checks: dict[str, Any] = field(default_factory=dict)  # tokens, tiles, transformer calls, output change
    notes: list[str] = field(default_factory=list)
    pipeline: str | None = None  # the --pipeline it needs to load (None: its model_index.json names its class)
    trust_remote_code: bool = False
    seed: int = 0
    build_s: float = 0.0
    format: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["folder"] = str(self.folder)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Path) -> "Twin":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["folder"] = Path(folder)
        return cls(**known)

    def text(self) -> str:
        return render(self)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def render(twin: Twin) -> str:
    lines = [f"twin of {twin.source} ({twin.pipeline_class}, {twin.modality}) in {twin.folder}"]
    cut = [c for c in twin.components if c.get("cuts")]
    lines.append("cut:" if cut else "cut: nothing (no block list could be cut)")
    for c in cut:
        lines.append(f"  {c['name']} ({c['class']}): {_params(c['params_source'])} -> {_params(c['params'])} params")
        for item in c["cuts"]:
            lines.append(f"    {item['list']} ({item['key']}): {item['before']} -> {item['after']} blocks, kept "
                         f"{item['kept']}: {item['why']}")
        for key, (before, after) in c.get("changes", {}).items():
            if key not in {i["key"] for i in c["cuts"]}:
                lines.append(f"    {key}: {_short(before)} -> {_short(after)}")
        for note in c.get("notes", []):
            lines.append(f"    {note}")
    lines.append("kept whole:")
    for c in twin.components:
        if c.get("cuts"):
            continue
        why = c.get("why", "")
        extra = f", {_params(c['params'])} params" if c.get("params") else ""
        lines.append(f"  {c['name']} ({c['class']}{extra}): {c['action']}" + (f": {why}" if why else ""))
        for key, (before, after) in c.get("changes", {}).items():
            lines.append(f"    {key}: {_short(before)} -> {_short(after)}")
        for note in c.get("notes", []):
            lines.append(f"    {note}")
    lines.append(f"size: {_params(twin.params)} parameters, {_size(twin.bytes)} on disk (float32); built in "
                 f"{twin.build_s:.1f} s")
    lines.append("call: " + ", ".join(f"{k}={v!r}" for k, v in twin.call.items()))
    tiling = twin.vae_tiling or ("enable_tiling() with no arguments (its config sets the tile)"
                                 if checks_tiles(twin) else "none")
    lines.append(f"vae_tiling: {tiling}")
    checks = twin.checks
    lines.append(f"checked: {checks.get('tokens')} tokens enter the first block (CP over 2/4/8 ranks: "
                 f"{'even' if isinstance(checks.get('tokens'), int) and checks['tokens'] % 8 == 0 else 'uneven'}); "
                 f"VAE decodes in {checks.get('tiles') or 'no'} tiles; transformer calls "
                 f"{checks.get('calls')}; two seeds change the first transformer output by up to "
                 f"{checks.get('output_change')}")
    for note in twin.notes:
        lines.append(f"note: {note}")
    if twin.pipeline:
        lines.append(f"load it with --pipeline {twin.pipeline}")
    return "\n".join(lines) + "\n"


def checks_tiles(twin: Twin) -> bool:
    return bool(twin.checks.get("tiles"))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
