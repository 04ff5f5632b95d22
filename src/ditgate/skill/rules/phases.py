"""The skill's phases as data: the files each phase must have, and the words that name a phase in prose.

Add a phase by adding a row to `PHASES` (and, when prose names it in a new way, a pattern to `PHASE_NAMES`).
`key` is the phase's key in `checklists/gates.json`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    key: str
    reference: str     # paths relative to the skill root
    checklist: str
    notebook: str

    @property
    def files(self) -> dict[str, str]:
        return {"reference": self.reference, "checklist": self.checklist, "notebook": self.notebook}


PHASES: tuple[Phase, ...] = (
    Phase("cache", "references/cache.md", "checklists/cache.yaml", "notebooks/20_cache.ipynb"),
    Phase("cp", "references/cp.md", "checklists/cp.yaml", "notebooks/30_cp.ipynb"),
    Phase("tp", "references/tp.md", "checklists/tp.yaml", "notebooks/40_tp.ipynb"),
    Phase("tep", "references/tep.md", "checklists/tep.yaml", "notebooks/50_tep.ipynb"),
    Phase("vaep", "references/vaep.md", "checklists/vaep.yaml", "notebooks/60_vaep.ipynb"),
)

# Reference files whose statements belong to a gate scope that is not a phase of the table above.
# "audio" is the audio rule of gates.json (rules.audio), "garbled" its garbled-output rule (rules.garbled).
EXTRA_FILE_SCOPES: dict[str, str] = {"references/audio.md": "audio"}

# How prose names a gate scope (case-insensitive). Order does not matter: every match on a line counts.
PHASE_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bcache\b(?![-_]dit)", "cache"),
    (r"\bcontext[- ]parallel\w*", "cp"),
    (r"\bCP\b", "cp"),
    (r"\bUlysses\b", "cp"),
    (r"\bring\b", "cp"),
    (r"\btensor[- ]parallel\w*", "tp"),
    (r"\bTP\b", "tp"),
    (r"\btext[- ]encoder[- ]parallel\w*", "tep"),
    (r"\bTE-?P\b", "tep"),
    (r"\bVAE[- ]parallel\w*", "vaep"),
    (r"\bVAE-?P\b", "vaep"),
    (r"\bhybrid\b", "hybrid"),
    (r"\bquanti[sz]\w*", "quantization"),
    (r"\bcompile\b", "compile"),
    (r"\baudio\b", "audio"),
    (r"\bgarbled\b", "garbled"),
)
PHASE_PATTERN = re.compile("|".join(f"(?P<g{i}>{p})" for i, (p, _) in enumerate(PHASE_NAMES)), re.IGNORECASE)


def file_scope(rel: str) -> str | None:
    """The gate scope a file's statements belong to when a line names none (references/cp.md -> "cp")."""
    for phase in PHASES:
        if phase.reference == rel:
            return phase.key
    return EXTRA_FILE_SCOPES.get(rel)


def named_scopes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, scope) of every phase name in `text`, left to right."""
    found = []
    for match in PHASE_PATTERN.finditer(text):
        index = int(match.lastgroup[1:])
        found.append((match.start(), match.end(), PHASE_NAMES[index][1]))
    return found
