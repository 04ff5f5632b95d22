"""Load a diffusion pipeline from a local folder or a `zoo:NAME` spec, offline.

The pipeline class comes from, in order: an explicit `pipeline="module:Class"`; the `_class_name` that
`model_index.json` names (a diffusers class, or a `[module, Class]` pair from an importable third-party package).
Code shipped inside the model folder runs only with `trust_remote_code=True`. A diffusers `ModularPipeline` (a
folder with `modular_model_index.json`, or `--pipeline` naming a ModularPipeline class, or `--pipeline modular`)
is loaded by `ditgate.core.modular` instead. A package that `model_index.json`
names and that ships in the repository's `examples/` folder (zoo:tinymm's `tinymm`) is put on `sys.path` first
(`ditgate.core.examples`); that is ditgate's own code, not code from the model folder.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from ditgate import zoo
from ditgate.core import logs
from ditgate.core import modular
from ditgate.core import warm as warm_mod
from ditgate.core.examples import ensure_packages
from ditgate.core.errors import DitgateError, ModelLoadError, ModelNotFoundError, NotAPipelineError, PipelineClassError, RemoteCodeError

_BUILTIN_LIBRARIES = {None, "diffusers", "transformers"}
_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def resolve(model: str | os.PathLike) -> Path:
    """The local folder behind `model`: a zoo spec is built (once) into the zoo cache."""
    if zoo.is_spec(model):
        return zoo.materialize(str(model))
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model path {str(path)!r} does not exist (a zoo model is written zoo:NAME; "
                                 f"known: {', '.join(zoo.names())})")
    if not (path / "model_index.json").is_file() and not modular.is_modular_folder(path):
        raise NotAPipelineError(f"{path} has no model_index.json (nor {modular.MODULAR_INDEX}): give the folder of "
                                "a whole diffusers pipeline (the one save_pretrained writes), not a single component")
    return path


def read_index(path: Path) -> dict[str, Any]:
    file = path / "model_index.json"
    try:
        index = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NotAPipelineError(f"{file} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise NotAPipelineError(f"cannot read {file}: {exc.strerror or exc}") from None
    if not isinstance(index, dict):
        raise NotAPipelineError(f"{file} holds a JSON {type(index).__name__}, not an object of components")
    return index


def _inside(file: str | None, folder: Path) -> bool:
    """Whether `file` lies in `folder`, as written (a link inside the folder that points outside is inside) or once
    links are resolved."""
    if not file:
        return False
    try:
        return (Path(os.path.abspath(file)).is_relative_to(Path(os.path.abspath(folder)))
                or Path(file).resolve().is_relative_to(Path(folder).resolve()))
    except OSError:
        return False


def _spec(name: str):
    try:
        return importlib.util.find_spec(name.split(".")[0])
    except (ImportError, ValueError):
        return None


def from_working_folder(spec) -> bool:
    """Whether a module was found only because the working folder is on sys.path (`python -m` puts it there): it
    sits directly in the working folder (a file, a package, or a link to either). Such a module is not installed:
    the remote-code rule applies to it as to the model folder's own files."""
    if spec is None:
        return False
    cwd = Path(os.path.abspath(os.getcwd()))
    places = [Path(os.path.abspath(spec.origin)).parent] if spec.origin and spec.has_location else []
    places += [Path(os.path.abspath(p)).parent for p in (spec.submodule_search_locations or [])]
    return any(place == cwd for place in places)


def _local_module(name: str, path: Path) -> bool:
    """True when importing the top-level module `name` would run a file inside the model folder `path` (links
    included, as written or resolved), or a file the working folder holds. Code inside the model folder is remote
    code whatever sys.path says (`python -m` puts the current folder on it)."""
    spec = _spec(name)
    if spec is None:
        return False
    origins = [spec.origin, *(spec.submodule_search_locations or [])]
    return any(_inside(origin, path) for origin in origins) or from_working_folder(spec)


def torch_dtype(dtype: Any):
    """`torch.float32` for "float32"/"fp32"/torch.float32 and likewise for float16 and bfloat16."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = _DTYPES.get(str(dtype).lower().removeprefix("torch."))
    if name is None:
        raise DtypeError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(_DTYPES))}")
    return getattr(torch, name)


class DtypeError(DitgateError, ValueError):
    """A dtype name ditgate does not know."""


def check_device(device: str | None) -> None:
    """Refuse a device ditgate cannot run on (it runs on "cpu", "cuda" and "cuda:N"), or a CUDA device this machine
    does not have, before anything is loaded."""
    if device is None:
        return
    kind, _, index = str(device).partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise DitgateError(f"device {device!r}: use cpu, cuda or cuda:N")
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise DitgateError(f"device {device!r}: no CUDA device is available here (use cpu)")
        if index and int(index) >= torch.cuda.device_count():
            raise DitgateError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def check_module_name(module_name: str, class_name: str, origin: str) -> None:
    """Refuse, without importing anything, a module name that is not an absolute dotted name (`..evil`) or that
    names a module of Python's standard library (`this`, `os`): neither holds a pipeline, and importing them runs
    code for nothing."""
    import sys

    if not all(part.isidentifier() for part in module_name.split(".")):
        raise PipelineClassError(f"module {module_name!r} for pipeline class {class_name!r} ({origin}) is not an "
                                 "absolute module name (dotted Python identifiers)")
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise PipelineClassError(f"module {module_name!r} ({origin}) is part of Python's standard library, not a "
                                 f"package with a pipeline class {class_name!r}")


def _import_class(module_name: str, class_name: str, origin: str):
    check_module_name(module_name, class_name, origin)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineClassError(f"cannot import module {module_name!r} for pipeline class {class_name!r} "
                                 f"({origin}): {exc}") from exc
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        raise PipelineClassError(f"module {module_name!r} has no class {class_name!r} ({origin})")
    return found


def _import_file_class(file: Path, class_name: str):
    spec = importlib.util.spec_from_file_location(f"ditgate_remote_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PipelineClassError(f"executing {file} failed: {exc!r}") from exc
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise PipelineClassError(f"{file} defines no class {class_name!r}") from None


def not_installed(name: str) -> bool:
    """No installed module of that name (one found only in the working folder does not count)."""
    spec = _spec(name)
    return spec is None or from_working_folder(spec)


def _remote_files(path: Path, index: dict[str, Any]) -> list[Path]:
    """Python files inside the model folder that loading `index` would execute."""
    files = []
    for key, value in index.items():
        if key.startswith("_") or not isinstance(value, (list, tuple)) or len(value) != 2:
            continue
        library = value[0]
        if library in _BUILTIN_LIBRARIES:
            continue
        if not isinstance(library, str):
            continue
        if _local_module(library, path):
            files.append(Path(_spec(library).origin or path / library))
            continue
        for candidate in (path / key / f"{library}.py", path / f"{library}.py"):
            if candidate.is_file() and not_installed(library):
                files.append(candidate)
    return files


def pipeline_class(path: Path, index: dict[str, Any], pipeline: str | None = None, trust_remote_code: bool = False):
    """Resolve the pipeline class for the folder `path` (see the module docstring for the order)."""
    if pipeline:
        module_name, sep, class_name = pipeline.partition(":")
        if not sep or not module_name or not class_name:
            raise PipelineClassError(f"--pipeline must be written module:Class, got {pipeline!r}")
        return _import_class(module_name, class_name, "given with --pipeline")
    name = index.get("_class_name")
    if isinstance(name, (list, tuple)) and len(name) == 2:
        module_name, class_name = name
        if not (isinstance(module_name, str) and isinstance(class_name, str)):
            raise PipelineClassError(f"{path / 'model_index.json'}: _class_name must be a class name or a "
                                     f"[module, Class] pair of strings, got {name!r}")
        check_module_name(module_name, class_name, "named in model_index.json")
        local = path / f"{module_name}.py"
        if _local_module(module_name, path) or (local.is_file() and not_installed(module_name)):
            if not trust_remote_code:
                raise RemoteCodeError(f"model_index.json names {class_name} from {local}, code inside the model "
                                      "folder; read it, then pass --trust-remote-code to run it")
            if local.is_file():
                return _import_file_class(local, class_name)
        return _import_class(module_name, class_name, "named in model_index.json")
    if not isinstance(name, str) or not name:
        raise PipelineClassError(f"{path / 'model_index.json'} names no pipeline class (_class_name)")
    import diffusers

    cls = getattr(diffusers, name, None)
    if cls is None:
        raise PipelineClassError(f"pipeline class {name!r} is not part of diffusers {diffusers.__version__}; if it "
                                 "comes from a third-party package, pass --pipeline module:Class")
    return cls


def call_class(model: str | os.PathLike, pipeline: str | None = None, trust_remote_code: bool = False):
    """The class whose `__call__` a run of `model` makes, found without loading weights (None for a modular
    pipeline: its blocks, known once loaded, say what it takes)."""
    path = resolve(model)
    if modular.wants_modular(path, pipeline):
        return None
    index = read_index(path)
    ensure_packages(index)
    remote = _remote_files(path, index)
    if remote and not trust_remote_code:
        raise RemoteCodeError(f"loading {path} would run code from the model folder ({', '.join(map(str, remote))});"
                              " read it, then pass --trust-remote-code")
    return pipeline_class(path, index, pipeline, trust_remote_code)


@contextlib.contextmanager
def _offline():
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _loading(exc: BaseException) -> str:
    """The component diffusers was loading when `exc` was raised (its loader's `name`), or "?"."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "load_sub_model" and isinstance(tb.tb_frame.f_locals.get("name"), str):
            return tb.tb_frame.f_locals["name"]
        tb = tb.tb_next
    return "?"


def load(model: str | os.PathLike, dtype: Any = "float32", device: str | None = "cpu", *,
         pipeline: str | None = None, trust_remote_code: bool = False, warm: bool = True, **kwargs):
    """Load the pipeline at `model` (a folder or `zoo:NAME`) without touching the network.

    `dtype` is a torch dtype or its name; `device` is where the pipeline is moved ("cpu", "cuda", "cuda:1", or
    None to leave it); `pipeline` is a "module:Class" override; other keyword arguments go to `from_pretrained`.
    A pipeline the process keeps loaded for this folder (`ditgate.core.warm`, in a command `ditgate serve` runs)
    is taken instead of reading the folder when `warm` and no other keyword is given.
    """
    check_device(device)
    dtype = torch_dtype(dtype)
    path = resolve(model)
    kept = warm_mod.take(path, dtype, pipeline) if warm and not kwargs and not trust_remote_code else None
    if kept is not None:
        return kept if device in (None, "cpu") else kept.to(device)
    if modular.wants_modular(path, pipeline):
        with _offline():
            return logs.quiet_pipeline(modular.load(path, torch_dtype(dtype), device, pipeline=pipeline,
                                                    trust_remote_code=trust_remote_code))
    index = read_index(path)
    ensure_packages(index)  # zoo:tinymm's package lives in the repository's examples/ folder
    remote = _remote_files(path, index)
    if remote and not trust_remote_code:
        raise RemoteCodeError(f"loading {path} would run code from the model folder ({', '.join(map(str, remote))});"
                              " read it, then pass --trust-remote-code")
    cls = pipeline_class(path, index, pipeline, trust_remote_code)
    if not hasattr(cls, "from_pretrained"):
        raise PipelineClassError(f"{cls.__module__}.{cls.__qualname__} has no from_pretrained; it is not a pipeline")
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    try:
        with _offline():
            pipe = cls.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
    except (RuntimeError, ValueError) as exc:
        text = " ".join(str(exc).split())
        if "mismatch" not in text.lower() and "expected shape" not in text:
            raise
        said = "" if "ignore_mismatched_sizes" in text else f": {text[:200]}"  # that one points at a hidden report
        raise ModelLoadError(f"cannot load {path}: the weights of component {_loading(exc)} do not match its "
                           f"config.json (a size the config gives wrong: vocab_size, hidden_size, a layer count){said}"
                           ) from None
    if device is not None:
        pipe = pipe.to(device)
    for component in getattr(pipe, "components", {}).values():
        if hasattr(component, "eval"):
            component.eval()
    return logs.quiet_pipeline(pipe)
