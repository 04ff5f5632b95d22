"""The audio noise floor: the baseline run again with rounding-size noise, and how its distance from the baseline
sets the audio gate (checklists/gates.json `rules.audio.calibration`).

Why a perturbation. The audio rule accepts a candidate that is no further from the baseline than the same
configuration run twice. On a CPU two runs are bit-identical (on a GPU too, for zoo:stable-audio on an H200), so a
plain rerun measures nothing. What
differs between two GPU runs of one configuration is rounding: a nondeterministic kernel (split reductions, atomics)
rounds some elements of a layer's output differently, by about one unit roundoff of the run dtype. The calibration
row reproduces that on any device: it is the baseline with every transformer output x replaced by x * (1 + u z), u
the unit roundoff of x's dtype (2^-24 in float32, 2^-8 in bfloat16, 2^-11 in float16) and z standard normal noise
drawn on the tensor's device from a generator seeded with the run's seed (again for each pipeline call), so two calibrations are
identical. The unit-roundoff calibration perturbs the output of every transformer block too: kernels that tile
differently round differently in every layer, and those roundings add up with depth. Measured in bfloat16 on the
zoo, with the transformer's output alone perturbed the first-step floor was blind to depth (63-64 dB for 2-4 blocks,
66.7 dB for FLUX.1-dev's 57 on an H200) and correct rows sat up to 7.3 dB below it; with every block perturbed every
correct row's first step sits above it (+3.7 to +18.8 dB) and every planted fault below (-4.5 to -29 dB). A second seed is not
the same configuration (another sample of the model); a second dtype is not either (and it is no small change: on
zoo:stable-audio bfloat16 moves the latents as far as another prompt does).

How the floor is used (`use`): "looser" keeps, for each waveform check, the looser of the default and the measured
value; "replace" takes the measured value. A metric whose measured value is not finite (the calibration equalled
the baseline) keeps the default.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

UNIT_ROUNDOFF = "unit_roundoff"


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of a floating dtype: the largest relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


class OutputNoise:
    """Forward hooks that multiply every tensor a transformer returns by (1 + size z), z ~ N(0, 1), seeded."""

    def __init__(self, size: float | str, seed: int):
        self.size = size
        self.seed = seed
        self.generators: dict[torch.device, torch.Generator] = {}  # one per device, each seeded with `seed`
        self.calls = 0
        self._handles: list = []

    def reset(self) -> None:
        """Start the noise again from the seed (before each pipeline call, so that every call is perturbed alike)."""
        for generator in self.generators.values():
            generator.manual_seed(self.seed)
        self.calls = 0

    def _generator(self, device: torch.device) -> torch.Generator:
        # drawn where the tensor lives: a CPU draw copied to the GPU for every block output made the calibration row
        # of FLUX.1-dev (57 blocks, 28 steps, 1024^2) take 172 s on an H200 against 8.6 s for the baseline
        if device not in self.generators:
            self.generators[device] = torch.Generator(device).manual_seed(self.seed)
        return self.generators[device]

    def attach(self, pipe) -> OutputNoise:
        """Perturb what every transformer returns and, for the calibration's unit-roundoff noise, what each of its
        blocks returns (see the module docstring)."""
        from ditgate.core.components import block_lists, transformers_of

        for module in transformers_of(pipe).values():
            self._handles.append(module.register_forward_hook(self._hook))
            if self.size == UNIT_ROUNDOFF:
                for blocks in block_lists(module).values():
                    self._handles += [block.register_forward_hook(self._block_hook) for block in blocks]
        if not self._handles:
            raise ValueError(f"{type(pipe).__name__} has no transformer component to perturb")
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _noisy(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            return x
        size = unit_roundoff(x.dtype) if self.size == UNIT_ROUNDOFF else float(self.size)
        z = torch.randn(x.shape, generator=self._generator(x.device), dtype=torch.float32, device=x.device)
        return (x.float() * (1.0 + size * z)).to(x.dtype)

    def _hook(self, module, args, output):
        self.calls += 1
        return _map_tensors(output, self._noisy)

    def _block_hook(self, module, args, output):
        return _map_tensors(output, self._noisy)


def _map_tensors(value: Any, fn) -> Any:
    """`value` with `fn` applied to each tensor in it: a tensor, a tuple/list, or a dataclass output (BaseOutput)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: fn(getattr(value, f.name)) for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), torch.Tensor)}
        return dataclasses.replace(value, **changed)
    return value


def finite_floor(measured: dict[str, float | None]) -> dict[str, float]:
    """The measured metrics that are a floor at all: finite numbers (inf: the calibration equalled the baseline)."""
    return {k: float(v) for k, v in measured.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def gate_floor(measured: dict[str, float | None], gates: dict | None = None) -> dict[str, float]:
    """The `floor=` argument of `ditgate.gates.evaluate` for a measured noise floor, as `rules.audio.calibration.use`
    says: "looser" keeps only the metrics whose measured value is looser than the default; "replace" keeps all."""
    from ditgate.gates.verdicts import OPS, load_gates

    gates = load_gates() if gates is None else gates
    rule = gates["rules"]["audio"]
    floor = finite_floor({k: v for k, v in measured.items() if k in {c["metric"] for c in rule["checks"]}})
    if rule["calibration"]["use"] == "replace":
        return floor
    # looser: the measured value is kept where the default check would reject it (it is the wider threshold)
    return {c["metric"]: floor[c["metric"]] for c in rule["checks"]
            if c["metric"] in floor and not OPS[c["op"]](floor[c["metric"]], c["value"])}


def reduced_precision(dtype: Any, gates: dict | None = None) -> bool:
    """Whether a run in `dtype` is outside `rules.tensor.dtypes` (bfloat16, float16): its exact phases are not exact."""
    from ditgate.gates.verdicts import load_gates, normalize_dtype

    gates = load_gates() if gates is None else gates
    return normalize_dtype(dtype) not in gates["rules"]["tensor"]["dtypes"]


def uses_floor(modality: str | None, dtype: Any, gates: dict | None = None) -> bool:
    """Whether a gated row of `modality` in a run of `dtype` is judged against the calibration row's floor: audio
    always (rules.audio.calibration), every modality in reduced precision (rules.reduced_precision)."""
    return modality == "audio" or (modality is not None and reduced_precision(dtype, gates))
