"""The model a command runs, resolved once at the command's edge: one value carried by every command.

`Model.open(name, ...)` takes what a user gives (a folder or `zoo:NAME`, the pipeline class override, consent to
run code from the model folder, the call options, dtype and device) and resolves all of it before anything heavy
runs: the folder (a zoo model is built into the zoo cache), whether it is a diffusers ModularPipeline, the pipeline
class (the remote-code rule applies here), the request fitted to the pipeline's call (`ditgate.core.request`), and
dtype and device with "auto" resolved. Every later stage reads this value; none resolves the path again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ditgate.core import modular
from ditgate.core import request as request_mod
from ditgate.core.errors import DitgateError
from ditgate.core.request import Request


@dataclass(frozen=True)
class Model:
    name: str  # as given: a folder or zoo:NAME (run folders and reports name the model by it)
    path: Path  # the folder the pipeline loads from
    request: Request  # the call, fitted to the pipeline
    dtype: str = "float32"  # resolved: float32, bfloat16 or float16 (as given: "fp32" stays "fp32")
    device: str = "cpu"  # resolved: cpu, cuda or cuda:N
    pipeline: str | None = None  # --pipeline module:Class (or "modular")
    trust_remote_code: bool = False
    is_modular: bool = False  # a diffusers ModularPipeline (loaded by ditgate.core.modular)
    call_class: str | None = field(default=None, compare=False)  # "module.Class" whose call runs (None: modular)

    @classmethod
    def open(cls, name: str | os.PathLike, *, pipeline: str | None = None, trust_remote_code: bool = False,
             dtype: str = "auto", device: str = "auto", call: dict[str, Any] | None = None,
             call_file: str | Path | None = None, request: Request | None = None, weights: bool = True,
             **named: Any) -> "Model":
        """Resolve `name` and its call. The request is the folder's ditgate.json, then `call_file`, then `call`,
        then the `named` values (prompt, height, width, frames, steps, seed, image; see ditgate.core.request.build),
        fitted to the pipeline; or `request` as given, fitted. DitgateError on anything that cannot run.
        `weights=False`: a folder of configs alone is enough (a modular one's components need no weight files)."""
        from ditgate import zoo
        from ditgate.core import loader

        device, dtype = request_mod.device_and_dtype(device, dtype)
        try:
            loader.torch_dtype(dtype)
        except ValueError as exc:
            raise DitgateError(f"--dtype: {exc}") from None
        try:
            loader.check_device(device)
        except DitgateError as exc:
            raise DitgateError(f"--{exc}") from None
        path = loader.resolve(name)
        is_modular = modular.wants_modular(path, pipeline)
        if not modular.is_modular_folder(path):
            loader.read_index(path)  # a model_index.json that cannot be read is refused before anything runs
        req = request or request_mod.build(zoo.read_meta(path),
                                           extra=request_mod.read_call_file(call_file) | dict(call or {}), **named)
        cls_ = loader.call_class(path, pipeline, trust_remote_code)
        if cls_ is None:  # a modular pipeline: fitted to its blocks' inputs (configs only)
            pipe = modular.from_pretrained(path, pipeline, trust_remote_code)
            fitted = request_mod.fit_blocks(req, pipe, modular.standard_class(path))
            modular.output_name(pipe, fitted.call)
            call_name = None
        else:
            fitted = request_mod.resolve(req, cls_)
            call_name = f"{cls_.__module__}.{cls_.__qualname__}"
        modular.check(path, pipeline, trust_remote_code, fitted.call, weights=weights)
        return cls(name=str(name), path=path, request=fitted, dtype=dtype, device=device, pipeline=pipeline,
                   trust_remote_code=trust_remote_code, is_modular=is_modular, call_class=call_name)

    def load(self, device: str | None = "", **kwargs: Any):
        """The pipeline, loaded offline from `path` in the model's dtype, on its device (or on `device`)."""
        from ditgate.core.loader import load

        return load(self.path, dtype=self.dtype, device=self.device if device == "" else device,
                    pipeline=self.pipeline, trust_remote_code=self.trust_remote_code, **kwargs)

    def with_request(self, request: Request) -> "Model":
        return replace(self, request=request)

    @property
    def is_zoo(self) -> bool:
        from ditgate import zoo

        return zoo.is_spec(self.name)

    def to_dict(self) -> dict[str, Any]:
        """What a worker rank needs to rebuild this value without resolving anything again."""
        return {"name": self.name, "path": str(self.path), "request": self.request.to_dict(), "dtype": self.dtype,
                "device": self.device, "pipeline": self.pipeline, "trust_remote_code": self.trust_remote_code,
                "is_modular": self.is_modular, "call_class": self.call_class}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Model":
        return cls(**{**data, "path": Path(data["path"]), "request": Request.from_dict(data["request"])})
