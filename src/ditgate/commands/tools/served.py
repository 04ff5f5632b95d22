"""How `ditgate serve` runs one command: forked, on the pipeline it keeps loaded, or in its own process on a GPU.

A CPU command runs in a forked child of the server (`forked`), which has the imports done and, when the server
loaded it before forking (`keep_for`), the command's pipeline in host memory (ditgate.core.warm). A GPU command
runs in the server's own process (`inline`): on a GPU machine the imports of diffusers, transformers and cache-dit
initialise CUDA, and a forked child cannot use a CUDA context its parent made ("Cannot re-initialize CUDA in forked
subprocess", measured on the H200 machine), so it is never forked.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time

WARM_COMMANDS = ("run", "diff", "inspect", "checklist")  # the commands whose pipeline the server keeps loaded
CHILD_ENV = "DITGATE_IN_SERVER"  # set in the command the server runs: it never forwards again


def _as_client(request: dict, fds: list[int], entry) -> int:
    """Run the client's command on its streams (`fds` put on 0, 1, 2 and closed), in its folder and environment: its exit
    status (a traceback on its own stderr for anything the command let escape)."""
    code = 1
    try:
        _flush()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"], **{CHILD_ENV: "1"})
        code = entry(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException:  # noqa: BLE001 - the command's own traceback, on its own stderr
        import traceback

        traceback.print_exc()
    finally:
        _flush()
    return code


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream the command closed
            pass


def forked(request: dict, fds: list[int], entry) -> None:
    """In the forked child: become the client's process and run its command; never returns."""
    code = 1
    try:
        os.setsid()  # its own process group: a client that goes away ends all of it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = _as_client(request, fds, entry)
    finally:
        os._exit(code)


def wants_cuda(device: str) -> bool:
    """Whether `device` means a GPU, found without making a CUDA context in this process (NVML counts them)."""
    if device != "auto":
        return device.startswith("cuda")
    import torch

    saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK")
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved


def parsed(argv: list[str]) -> argparse.Namespace | None:
    """The options of a command whose pipeline the server may keep (run, diff, inspect, checklist), or None."""
    import contextlib
    import io

    if not argv or argv[0] not in WARM_COMMANDS:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"ditgate.commands.model.{argv[0]}").register(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args, _ = parser.parse_known_args(argv[1:])
    except (Exception, SystemExit):  # noqa: BLE001 - the command itself reports what is wrong
        return None
    return args if getattr(args, "model", None) and hasattr(args, "device") else None


def keep_for(args: argparse.Namespace, cwd: str, command: str = "") -> None:
    """Load the pipeline the command will load, in host memory, before forking it: the forked command takes it
    (ditgate.core.warm) and the next command on the same folder finds it loaded; then what the command's module
    prepares before it runs (its `warm(args)`: `run` counts its FLOP profile, kept by ditgate.run.define.predict
    for the runs after). A model whose code comes from its folder is not loaded here. Anything that goes wrong is
    left to the command to report."""
    from ditgate.core import loader, warm
    from ditgate.core import request as request_mod

    if args.trust_remote_code:
        return
    here = os.getcwd()
    try:
        os.chdir(cwd)
        dtype = loader.torch_dtype(request_mod.resolve_dtype(args.dtype, "cpu"))
        path = loader.resolve(args.model)
        if not warm.has(path, dtype, args.pipeline):
            start = time.perf_counter()
            warm.keep(path, dtype, args.pipeline, loader.load(path, dtype, "cpu", pipeline=args.pipeline, warm=False))
            name = str(dtype).removeprefix("torch.")
            print(f"ditgate serve: keeping {path} loaded ({name}, {time.perf_counter() - start:.1f} s) for the "
                  "commands that load it", file=sys.__stderr__, flush=True)
        if command in WARM_COMMANDS:  # what the command module prepares in the server (`warm(args)`), if anything
            prepare = getattr(importlib.import_module(f"ditgate.commands.model.{command}"), "warm", None)
            if prepare is not None:
                prepare(args)
    except Exception:  # noqa: BLE001 - the command itself reports what is wrong
        return
    finally:
        os.chdir(here)


def inline(request: dict, fds: list[int], entry) -> int:
    """Run a command (a GPU command, or any with `ditgate serve --inline`) in the server's own process, on the
    client's streams, folder and environment, and put the server's back afterwards. A forked child cannot use CUDA
    once its parent's imports have initialised it (importing diffusers, transformers and cache-dit together does on
    a GPU machine), so a GPU command is never forked; it runs to its end even when its client goes away. A run
    gives back its pristine pipeline, never run or changed, when it ends (ditgate.core.warm.give_back): the next
    command on the same folder, dtype and class takes it instead of loading (any other load, or a GPU worker group,
    lets it go first)."""
    from ditgate.core import warm

    saved = [os.dup(target) for target in (0, 1, 2)]
    environ, cwd = dict(os.environ), os.getcwd()
    warm.between_commands(True)  # the run gives back its pristine pipeline: the next command on it takes it
    try:
        return _as_client(request, fds, entry)
    finally:
        warm.between_commands(False)
        for target, fd in zip((0, 1, 2), saved):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        warm.release_memory()
        for path, dtype, *_ in warm.kept():  # on the server's own stderr again
            print(f"ditgate serve: keeping {path} loaded ({dtype.removeprefix('torch.')}, on the device its run "
                  "used) for the next command that loads it", file=sys.stderr, flush=True)
