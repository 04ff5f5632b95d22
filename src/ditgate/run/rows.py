"""Rows of the phase runner: what each run applies and which earlier row it is compared with.

A row is a name, the integration phase it checks (whose gate applies), a cache-dit cache configuration, a
parallelism configuration, optionally torch.compile and a cache-dit quantization configuration, and the name of its
baseline row. The world size follows from the parallel sizes.
Rows come from `DEFAULT_ROWS` or from a YAML file (a list of mappings with the fields of `Row`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError

PHASES = ("cache", "cp", "tp", "tep", "vaep", "hybrid", "quantization", "compile")
# Parallel fields that are ditgate's own shorthand; every other key goes to cache_dit.ParallelismConfig as is.
_SHORTHAND = {"text_encoder", "vae"}
# ditgate's own cache fields; every other key goes to cache_dit.DBCacheConfig as is.
_CACHE_EXTRAS = {"mask", "taylorseer"}
# torch.compile options a row may set; "regional" (default True) compiles each repeated block, as cache-dit's CLI does.
COMPILE_OPTIONS = {"regional", "mode", "backend", "fullgraph", "dynamic"}


class RowError(DitgateError):
    """A row definition is invalid."""


@dataclass(frozen=True)
class Row:
    name: str
    phase: str | None = None  # None: a reference row (baselines), never gated itself
    baseline: str | None = "baseline"  # name of the row this one is compared with
    cache: dict[str, Any] | None = None  # DBCacheConfig fields; plus mask: "alternate" | [1, 0, ...], taylorseer: order
    parallel: dict[str, Any] | None = None  # ulysses_size, ring_size, tp_size, text_encoder, vae, other ParallelismConfig fields
    vae_tiling: bool = False  # decode with vae.enable_tiling() (the reference of VAE-P)
    perturb: float | str | None = None  # noise multiplied into every transformer output (see ditgate.gates.calibration)
    description: str = ""
    compile: bool | dict[str, Any] = False  # torch.compile the transformer(s): True, or options (COMPILE_OPTIONS)
    quantize: dict[str, Any] | None = None  # cache_dit.QuantizeConfig fields, e.g. {"quant_type": "float8_per_row"}

    @property
    def world_size(self) -> int:
        p = self.parallel or {}
        cp = (p.get("ulysses_size") or 1) * (p.get("ring_size") or 1)
        return cp * (p.get("tp_size") or 1)

    @property
    def cp_size(self) -> int:
        p = self.parallel or {}
        return (p.get("ulysses_size") or 1) * (p.get("ring_size") or 1)

    @property
    def tp_size(self) -> int:
        return (self.parallel or {}).get("tp_size") or 1

    @property
    def compile_options(self) -> dict[str, Any] | None:
        """torch.compile options of this row, or None when it does not compile."""
        if not self.compile:
            return None
        return {"regional": True} | (self.compile if isinstance(self.compile, dict) else {})

    def fingerprint(self) -> str:
        """Changes whenever anything that affects this row's output changes (used by --resume)."""
        fields = dataclasses.asdict(self) | {"description": ""}
        for key in ("compile", "quantize"):  # rows without them keep the fingerprint they had before these existed
            if not fields[key]:
                del fields[key]
        blob = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"world_size": self.world_size}


# The cache configuration of the default rows: one block in front (Fn=1), none behind, a static schedule that
# computes the first two steps and then every other step. A static schedule caches the same steps on one process
# and on several, so a cached parallel row can be compared exactly with the cached single-process row.
DEFAULT_CACHE = {"Fn_compute_blocks": 1, "Bn_compute_blocks": 0, "max_warmup_steps": 2, "mask": "alternate"}

BASELINE = Row("baseline", baseline=None, description="single process, no cache, no parallelism")
BASELINE_TILED = Row("baseline-tiled", baseline=None, vae_tiling=True,
                     description="baseline decoded with the tiled VAE: the reference of VAE parallelism")

DEFAULT_ROWS: tuple[Row, ...] = (
    BASELINE,
    Row("cache", "cache", cache=DEFAULT_CACHE, description="DBCache F1B0, static schedule"),
    Row("cp-ulysses-2", "cp", parallel={"ulysses_size": 2}, description="Ulysses context parallelism, 2 ranks"),
    Row("cp-ring-2", "cp", parallel={"ring_size": 2}, description="ring context parallelism, 2 ranks"),
    Row("tp-2", "tp", parallel={"tp_size": 2}, description="tensor parallelism of the transformer, 2 ranks"),
    Row("tp-2+tep", "tep", parallel={"tp_size": 2, "text_encoder": True},
        description="TP plus text-encoder parallelism"),
    Row("tp-2+vaep", "vaep", baseline="baseline-tiled", parallel={"tp_size": 2, "vae": True},
        description="TP plus VAE parallelism, against the tiled baseline"),
    Row("cache+ulysses-2", "cp", baseline="cache", cache=DEFAULT_CACHE, parallel={"ulysses_size": 2},
        description="cache enabled before Ulysses-2, against the cached single-process row"),
    Row("hybrid-u2xtp2", "hybrid", parallel={"ulysses_size": 2, "tp_size": 2},
        description="Ulysses-2 x TP-2 on 4 ranks"),
)
# The audio noise floor (gates.json rules.audio.calibration): the runner adds it by itself when an audio row is gated.
CALIBRATION = Row("calibration", perturb="unit_roundoff",
                  description="the baseline again, every transformer output perturbed by one rounding error: the "
                              "audio noise floor")
REFERENCE_ROWS = {r.name: r for r in (BASELINE, BASELINE_TILED, CALIBRATION)}


def _check(row: Row) -> Row:
    if not row.name or any(c in row.name for c in "/\\ ,") or row.name.startswith("."):
        raise RowError(f"row name {row.name!r} must be non-empty, without spaces, commas or slashes")
    if row.phase is not None and row.phase not in PHASES:
        raise RowError(f"row {row.name!r}: unknown phase {row.phase!r}; phases: {', '.join(PHASES)}")
    if row.phase is not None and not row.baseline:
        raise RowError(f"row {row.name!r}: a gated row needs a baseline row to compare with")
    size = row.perturb
    if size is not None and size != "unit_roundoff" and (
            isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size < float("inf")):
        raise RowError(f"row {row.name!r}: perturb must be 'unit_roundoff' or a positive number, got {row.perturb!r}")
    for key in ("ulysses_size", "ring_size", "tp_size"):
        value = (row.parallel or {}).get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise RowError(f"row {row.name!r}: parallel.{key} must be a positive integer, got {value!r}")
    if not isinstance(row.compile, (bool, dict)):
        raise RowError(f"row {row.name!r}: compile must be true, false or a mapping of options, got {row.compile!r}")
    unknown = set(row.compile) - COMPILE_OPTIONS if isinstance(row.compile, dict) else set()
    if unknown:
        raise RowError(f"row {row.name!r}: unknown compile option(s) {', '.join(sorted(unknown))}; "
                       f"known: {', '.join(sorted(COMPILE_OPTIONS))}")
    quantize = row.quantize
    if quantize is not None and not (isinstance(quantize, dict) and isinstance(quantize.get("quant_type"), str)):
        raise RowError(f"row {row.name!r}: quantize must be a mapping with a quant_type, got {quantize!r}")
    return row


def from_mapping(data: dict[str, Any], where: str = "") -> Row:
    known = {f.name for f in dataclasses.fields(Row)}
    unknown = set(data) - known
    if unknown:
        raise RowError(f"{where}unknown row field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    if "name" not in data:
        raise RowError(f"{where}a row needs a name")
    return _check(Row(**data))


def load_rows(path: str | Path) -> list[Row]:
    """Rows from a YAML file: a list of mappings, or a mapping with a `rows` list."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RowError(f"rows file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise RowError(f"rows file {path} is not valid YAML: {exc}") from None
    if isinstance(data, dict):
        data = data.get("rows")
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise RowError(f"rows file {path} must hold a list of rows (mappings)")
    return [from_mapping(item, f"{path}, row {i + 1}: ") for i, item in enumerate(data)]


def select(rows: list[Row] | tuple[Row, ...], names: str | list[str] | None) -> list[Row]:
    """The rows named in `names` (comma-separated or a list), plus every baseline they are compared with."""
    by_name = {r.name: r for r in (*REFERENCE_ROWS.values(), *rows)}
    if names is None:
        wanted = [r.name for r in rows]
    else:
        wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise RowError(f"unknown row(s) {', '.join(missing)}; known: {', '.join(by_name)}")
    chosen: dict[str, Row] = {}

    def add(name: str, chain: tuple[str, ...] = ()) -> None:
        if name in chain:
            raise RowError(f"rows compare with each other in a cycle: {' -> '.join(chain + (name,))}")
        row = by_name.get(name)
        if row is None:
            raise RowError(f"row {chain[-1]!r} compares with unknown row {name!r}")
        if row.baseline:
            add(row.baseline, chain + (name,))
        chosen.setdefault(name, row)

    for name in wanted:
        add(name)
    return list(chosen.values())
