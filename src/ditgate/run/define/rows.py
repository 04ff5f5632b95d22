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
    also_against: dict[str, str] | None = None  # further rows it is gated against: {row name: phase of the gate}
    # one more prompt or seed of a lossy row (ditgate.run.define.variants): {"of": row, "prompt": text, "seed": n}
    variant: dict[str, Any] | None = None

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
        del fields["also_against"]  # what the row is compared with does not change its output
        for key in ("compile", "quantize", "variant"):  # rows without them keep the fingerprint they had before
            if not fields[key]:
                del fields[key]
        blob = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"world_size": self.world_size}

    def request_for(self, request):
        """The request this row runs: the run's, with its variant's prompt and seed (ditgate.core.request.Request)."""
        if not self.variant:
            return request
        call = dict(request.call)
        if self.variant.get("prompt") is not None:
            call["prompt"] = self.variant["prompt"]
        return dataclasses.replace(request, call=call, seed=self.variant.get("seed", request.seed))


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
        also_against={"baseline": "cache"},
        description="cache enabled before Ulysses-2: the cp gate against the cached single-process row, the cache "
                    "gate against the baseline"),
    Row("hybrid-u2xtp2", "hybrid", parallel={"ulysses_size": 2, "tp_size": 2},
        description="Ulysses-2 x TP-2 on 4 ranks"),
)
# The noise floor (gates.json rules.audio.calibration, rules.reduced_precision): the runner adds it by itself when a
# gated row uses it (an audio row; any row of a run in a dtype outside rules.tensor.dtypes).
CALIBRATION = Row("calibration", perturb="unit_roundoff",
                  description="the baseline again, every transformer and transformer-block output perturbed by one "
                              "rounding error of the run dtype: the noise floor of audio rows and of every row in "
                              "reduced precision")
# The power of the gates (ditgate.run.judge.discrimination): the runner adds FAULT_SIZE when a row is gated, its scale
# from gates.json rules.sensitivity.fault_size, and SENSITIVITY when a gated row's gate is lossy or has a noise floor.
FAULT_SIZE = Row("sensitivity-fault-size", perturb=0.004,
                 description="the baseline with every transformer output multiplied by (1 + s z), s the size of the "
                             "smallest planted fault (gates.json rules.sensitivity.fault_size): a gate that rejects it "
                             "rejects a fault of realistic size")
SENSITIVITY = Row("sensitivity", perturb=10.0,
                  description="the baseline with every transformer output multiplied by (1 + 10 z): far outside every "
                              "gate unless the output does not depend on the transformer")
REFERENCE_ROWS = {r.name: r for r in (BASELINE, BASELINE_TILED, CALIBRATION, FAULT_SIZE, SENSITIVITY)}
# The caching-off twin of a cache row is NAME + this (ditgate.run.judge.cache_off): a name the runner makes itself.
CACHE_OFF_SUFFIX = "-cache-off"


def check_name(name: str, where: str = "") -> None:
    """Refuse a user row named like one ditgate adds itself: it would replace the check (a row called
    `sensitivity` would stand in for the discrimination check and pass whatever it compares)."""
    if name in REFERENCE_ROWS or name.endswith(CACHE_OFF_SUFFIX):
        raise RowError(f"{where}field name: {name!r} is reserved for ditgate's own rows ({', '.join(REFERENCE_ROWS)}, "
                       f"NAME{CACHE_OFF_SUFFIX}); choose another name")


def require_some(chosen: list[Row], given: str | None) -> list[Row]:
    """Refuse a choice of no row (`--rows ''`, `--rows ,`): a run of nothing would pass."""
    if not chosen:
        raise RowError(f"--rows {given!r} names no row: give at least one (see --list-rows)")
    return chosen


# What each phase needs configured: a row of that phase without it would compare the baseline with itself.
PHASE_FEATURES = {
    "cache": ("a cache configuration (cache: {...})", lambda r: r.cache is not None),
    "cp": ("a context-parallel size above 1 (parallel: {ulysses_size: N} or {ring_size: N})",
           lambda r: r.cp_size > 1),
    "tp": ("a tensor-parallel size above 1 (parallel: {tp_size: N})", lambda r: r.tp_size > 1),
    "tep": ("text-encoder parallelism (parallel: {tp_size: N, text_encoder: true})",
            lambda r: bool((r.parallel or {}).get("text_encoder")) and r.world_size > 1),
    "vaep": ("VAE parallelism (parallel: {tp_size: N, vae: true})",
             lambda r: bool((r.parallel or {}).get("vae")) and r.world_size > 1),
    "hybrid": ("both context and tensor parallelism (parallel: {ulysses_size: N, tp_size: M})",
               lambda r: r.cp_size > 1 and r.tp_size > 1),
    "quantization": ("a quantization (quantize: {quant_type: ...})", lambda r: r.quantize is not None),
    "compile": ("torch.compile (compile: true or options)", lambda r: bool(r.compile)),
}


def configured(row: Row) -> tuple[str, str] | None:
    """(what the row configures, the phase whose gate would judge it), or None for a row that configures no feature
    (a plain reference: the baseline, the tiled baseline, a perturbed check row)."""
    p = row.parallel or {}
    if row.world_size > 1:
        phase = "vaep" if p.get("vae") else "tep" if p.get("text_encoder") else \
            "hybrid" if row.cp_size > 1 and row.tp_size > 1 else "cp" if row.cp_size > 1 else "tp"
        return "parallelism (parallel: ...)", phase
    for field_name, what, phase in (("cache", "a cache (cache: ...)", "cache"),
                                    ("quantize", "a quantization (quantize: ...)", "quantization"),
                                    ("compile", "torch.compile (compile: ...)", "compile")):
        if getattr(row, field_name):
            return what, phase
    return None


_BOOLEAN_PARALLEL = ("text_encoder", "vae")
_SIZES = ("ulysses_size", "ring_size", "tp_size")
MAX_RANKS = 4096  # a size beyond any machine is a typo, refused before it is multiplied into a world size


def _type_error(where: str, name: Any, field_name: str, wanted: str, value: Any) -> RowError:
    label = f"row {name!r}, " if isinstance(name, str) and name else ""
    return RowError(f"{where}{label}field {field_name}: must be {wanted}, got {value!r} "
                    f"({type(value).__name__})")


def _check_types(row: Row, where: str) -> None:
    n = row.name
    if not isinstance(n, str) or not n or any(c in n for c in "/\\ ,") or n.startswith("."):
        raise _type_error(where, None, "name", "a non-empty string without spaces, commas or slashes", n)
    for key in ("phase", "baseline"):
        value = getattr(row, key)
        if value is not None and not isinstance(value, str):
            raise _type_error(where, n, key, "a string or null", value)
    if not isinstance(row.description, str):
        raise _type_error(where, n, "description", "a string", row.description)
    if not isinstance(row.vae_tiling, bool):
        raise _type_error(where, n, "vae_tiling", "true or false", row.vae_tiling)
    for key in ("cache", "parallel", "quantize"):
        value = getattr(row, key)
        if value is not None and not isinstance(value, dict):
            raise _type_error(where, n, key, "a mapping or null", value)
    for key in _SIZES:
        value = (row.parallel or {}).get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RANKS):
            raise _type_error(where, n, f"parallel.{key}", f"a positive integer (at most {MAX_RANKS})", value)
    for key in _BOOLEAN_PARALLEL:
        value = (row.parallel or {}).get(key)
        if value is not None and not isinstance(value, bool):
            raise _type_error(where, n, f"parallel.{key}", "true or false", value)
    if row.cache is not None and "mask" in row.cache and isinstance(row.cache["mask"], bool):
        raise _type_error(where, n, "cache.mask", "'alternate' or a list of 1 and 0", row.cache["mask"])
    if isinstance(row.cache, dict):
        _check_cache_values(row.cache, where, n)


# cache-dit 1.5.3 asserts these when a cached forward starts (caching/cache_contexts/cache_manager.py): refused here,
# before any row runs, instead of failing the row.
_CACHE_MINIMUM = {"Fn_compute_blocks": 1}


def _check_cache_values(cache: dict[str, Any], where: str, name: str) -> None:
    """Each value of cache-dit's own DBCacheConfig fields of the type its default has (a number where a number is
    expected, true/false where a flag is), and not below what cache-dit accepts (0; -1 where the default -1 means
    no limit; `_CACHE_MINIMUM`). Fields whose default is None take any value cache-dit takes."""
    import cache_dit

    defaults = {f.name: f.default for f in dataclasses.fields(cache_dit.DBCacheConfig)}
    for key, value in cache.items():
        default = defaults.get(key, dataclasses.MISSING)
        if key in _CACHE_EXTRAS or default is dataclasses.MISSING or default is None:
            continue
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise _type_error(where, name, f"cache.{key}", "true or false", value)
        elif isinstance(default, (int, float)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    isinstance(default, int) and not isinstance(value, int)):
                raise _type_error(where, name, f"cache.{key}", "an integer" if isinstance(default, int) else
                                  "a number", value)
            least = _CACHE_MINIMUM.get(key, -1 if default == -1 else 0)  # -1: cache-dit's "no limit"
            if value < least:
                raise _type_error(where, name, f"cache.{key}", f"at least {least}", value)


def _check(row: Row, where: str = "") -> Row:
    _check_types(row, where)
    at = f"{where}row {row.name!r}"
    if row.phase is not None and row.phase not in PHASES:
        raise RowError(f"{at}, field phase: unknown phase {row.phase!r}; phases: {', '.join(PHASES)}")
    also = row.also_against
    if also is not None and not (isinstance(also, dict) and all(
            isinstance(k, str) and v in PHASES for k, v in also.items())):
        raise RowError(f"{at}, field also_against: must map row names to phases ({', '.join(PHASES)}), "
                       f"got {also!r}")
    if row.phase is not None and not row.baseline:
        raise RowError(f"{at}: a gated row needs a baseline row to compare with")
    if row.phase is not None and not PHASE_FEATURES[row.phase][1](row):
        raise RowError(f"{at}: phase {row.phase} needs {PHASE_FEATURES[row.phase][0]}; without it the row would "
                       "compare the baseline with itself and prove nothing")
    size = row.perturb
    if size is not None and size != "unit_roundoff" and (
            isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size < float("inf")):
        raise RowError(f"{at}, field perturb: must be 'unit_roundoff' or a positive number, got {row.perturb!r}")
    if row.world_size > MAX_RANKS:
        raise RowError(f"{at}, field parallel: {row.world_size} ranks in all, more than {MAX_RANKS}")
    if not isinstance(row.compile, (bool, dict)):
        raise RowError(f"{at}, field compile: must be true, false or a mapping of options, got {row.compile!r}")
    unknown = set(row.compile) - COMPILE_OPTIONS if isinstance(row.compile, dict) else set()
    if unknown:
        raise RowError(f"{at}, field compile: unknown compile option(s) {', '.join(sorted(unknown))}; "
                       f"known: {', '.join(sorted(COMPILE_OPTIONS))}")
    quantize = row.quantize
    if quantize is not None and not isinstance(quantize.get("quant_type"), str):
        raise RowError(f"{at}, field quantize: must be a mapping with a quant_type, got {quantize!r}")
    return row


def from_mapping(data: dict[str, Any], where: str = "") -> Row:
    known = {f.name for f in dataclasses.fields(Row)}
    unknown = set(data) - known
    if unknown:
        raise RowError(f"{where}unknown row field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    if "name" not in data:
        raise RowError(f"{where}a row needs a name")
    return _check(Row(**data), where)


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
    if not data:
        raise RowError(f"rows file {path} holds no row: a run of nothing would pass")
    rows, seen = [], {}
    for i, item in enumerate(data):
        row = from_mapping(item, f"{path}, row {i + 1}: ")
        check_name(row.name, f"{path}, row {i + 1}, ")
        if row.name in seen:
            raise RowError(f"{path}, row {i + 1}, field name: {row.name!r} is already the name of row "
                           f"{seen[row.name]}; names must be unique")
        seen[row.name] = i + 1
        rows.append(row)
    _refuse_ungated(rows, path)
    return rows


def _refuse_ungated(rows: list[Row], path: Path) -> None:
    """A user's row that configures a feature but names no phase would run and never be gated (shown as a
    reference, exit 0): refused, unless it is an explicit reference (`baseline: null`) another row compares with."""
    compared = {name for r in rows for name in (r.baseline, *(r.also_against or {}))}
    for i, row in enumerate(rows):
        feature = configured(row) if row.phase is None else None
        at = f"{path}, row {i + 1}: row {row.name!r}"
        if feature and row.baseline:
            raise RowError(f"{at} configures {feature[0]} but names no phase, so it would run and never be gated; "
                           f"add phase: {feature[1]} (the gate it must pass), or baseline: null to make it a "
                           "reference row that another row compares with")
        if feature and row.name not in compared:
            raise RowError(f"{at} is a reference row that configures {feature[0]} but no row compares with it, so "
                           f"nothing would be gated; give it phase: {feature[1]} and a baseline, or add the row that "
                           "compares with it")


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
        for other in [row.baseline, *(row.also_against or {})]:
            if other:
                add(other, chain + (name,))
        chosen.setdefault(name, row)

    for name in wanted:
        add(name)
    return list(chosen.values())


def with_cache_config(rows: list[Row], fields: dict[str, Any]) -> list[Row]:
    """`rows` with every row that uses the default cache configuration (DEFAULT_CACHE) given `fields` on top of it."""
    if not fields:
        return list(rows)
    changed = [dataclasses.replace(r, cache=DEFAULT_CACHE | fields) if r.cache == DEFAULT_CACHE else r for r in rows]
    return [_check(r) for r in changed]
