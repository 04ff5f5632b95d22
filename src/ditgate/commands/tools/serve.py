"""`ditgate serve`: a warm process that runs `run`, `diff`, `inspect` and `checklist` without paying for the imports.

The server imports torch, diffusers, transformers, cache-dit and ditgate once, then listens on a Unix socket in a
folder of the user's that only the user may enter (`$DITGATE_HOME/serve/`, mode 0700, owned by the user: anything
else is refused). A command given `--server auto` (the default) whose environment matches the server's (the same
ditgate, Python and the environment variables the libraries read at import) hands the server its arguments, its
working folder, its environment and its three standard streams (passed as file descriptors); the server runs the
command exactly as `ditgate` would in a fresh process (the same code path, on the same streams) and sends back its
exit status: a CPU command in a forked child, on the pipeline the server keeps loaded; a GPU command in the
server's own process (`ditgate.commands.tools.served` says why). One command runs at a time: a client that finds the server busy (no greeting within
2 s) runs its command in its own process, as it would without a server. Without a server, with
a stale socket (nobody listening), a server of another ditgate or environment, or one that dies before it starts
the command, the command runs in its own process as usual: a server is used when there, never required.
A client that goes away (Ctrl-C) ends a forked command's whole process group (a command run in the server runs to
its end). The server exits after `--idle` seconds
without a client, or on `ditgate serve --stop`; killing it loses nothing (every run writes its own folder).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import signal
import socket
import sys
from stat import S_ISDIR, S_ISSOCK
import time
from pathlib import Path

from ditgate.commands.tools import served
from ditgate.commands.tools.served import CHILD_ENV
from ditgate.core.errors import DitgateError

HELP = "keep a warm process (imports done, pipelines loaded) that run/diff/inspect/checklist use when it is running (--server auto)"
IMPORT_ENV = ("HF_", "TRANSFORMERS_", "DIFFUSERS_", "CACHE_DIT", "DITGATE_", "TORCH", "CUDA_", "OMP_", "MKL_",
              "PYTHON", "TOKENIZERS_", "USE_HUB_KERNELS")
MAX_IDLE = 10_000_000  # seconds (about 4 months): longer is no idle timeout, and inf overflows the socket's timeout
# the environment this process started with: the CLI imports this module before it sets its verbosity variables
# and before torch sets its own, so a server compares what it was started with to what a client was started with
_STARTED_WITH = dict(os.environ)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stop", action="store_true", help="stop the running server")
    parser.add_argument("--idle", type=float, default=1800.0, help="seconds without a client before the server "
                        "exits (default 1800)")
    parser.add_argument("--inline", action="store_true", help="run every command in the server's own process, as "
                        "a GPU command always is (a forked child cannot use the CUDA state the imports made)")


def folder() -> Path:
    return Path(os.environ.get("DITGATE_HOME", Path.home() / ".cache" / "ditgate")) / "serve"


def socket_path() -> Path:
    return folder() / "serve.sock"


def _private_folder(create: bool) -> Path | None:
    """The server's folder when it is the user's own and only the user's (0700); None (or DitgateError when
    creating) otherwise."""
    where = folder()
    if create and not where.exists():
        where.parent.mkdir(parents=True, exist_ok=True)
        where.mkdir(mode=0o700)  # made private; an existing folder is taken only as it is
    try:
        stat = where.lstat()
    except FileNotFoundError:
        return None
    if not S_ISDIR(stat.st_mode) or stat.st_uid != os.getuid() or stat.st_mode & 0o077:  # a link is no folder
        if create:
            raise DitgateError(f"{where} is not a private folder of this user (mode 0700): refusing to serve there")
        return None
    return where


def identity(environ: dict | None = None) -> dict:
    """What a client must share with the server for the forked command to behave as a fresh process would."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k.startswith(IMPORT_ENV) and k != CHILD_ENV}
    return {"ditgate": str(Path(__file__).resolve().parents[2]), "python": sys.executable, "env": env}


def _connect(timeout: float = 2.0) -> socket.socket | None:
    """A connection to a live server of this user, or None (no server, a stale socket, a folder not private)."""
    try:
        if _private_folder(create=False) is None or not S_ISSOCK(socket_path().lstat().st_mode):
            return None  # no server, or a folder not the user's own, or a file there that is not a socket
    except OSError:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(socket_path()))
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
            conn.close()
            return None
    except OSError:  # refused: nobody listens (a stale socket), or it went away
        conn.close()
        return None
    return conn


def _send(conn: socket.socket, data: dict, fds: list[int] = ()) -> None:
    payload = json.dumps(data).encode() + b"\n"
    if fds:
        socket.send_fds(conn, [payload], list(fds))
    else:
        conn.sendall(payload)


def _receive(conn: socket.socket, reader) -> dict | None:
    line = reader.readline()
    return json.loads(line) if line else None


def forward(argv: list[str]) -> int | None:
    """Run `argv` on the running server: its exit status, or None when there is no server to use (the caller then
    runs the command itself)."""
    if os.environ.get(CHILD_ENV):
        return None
    conn = _connect()
    if conn is None:
        return None
    with conn, conn.makefile("rb") as reader:
        try:
            hello = _receive(conn, reader)
            if not hello or hello.get("identity") != identity():
                return None  # another ditgate, Python or environment: this process runs the command
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            _send(conn, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
            started = _receive(conn, reader)
            if not started or "started" not in started:
                return None  # the server went away before the command started
        except (OSError, ValueError):
            return None
        conn.settimeout(None)
        try:
            done = _receive(conn, reader)
        except KeyboardInterrupt:
            return 130  # closing the connection ends the command on the server
        except (OSError, ValueError):
            done = None
    if not done or "rc" not in done:
        print("ditgate: error: the server ended while running the command (ditgate serve); run it again",
              file=sys.stderr)
        return 1
    return int(done["rc"])


def _serve_one(conn: socket.socket, entry, inline: bool = False) -> bool:
    """Run one client's command; False when it asked the server to stop."""
    with conn, conn.makefile("rb") as reader:
        _send(conn, {"identity": identity(_STARTED_WITH), "pid": os.getpid()})
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(msg.split(b"\n")[0] or b"{}")
        if request.get("stop"):
            _send(conn, {"stopped": os.getpid()})
            return False
        if len(fds) != 3 or "argv" not in request:
            for fd in fds:
                os.close(fd)
            return True
        args = served.parsed(request["argv"])
        _send(conn, {"started": os.getpid()})  # before any load: the client waits for it only 2 s
        if inline or (args is not None and served.wants_cuda(args.device)):
            code = served.inline(request, fds, entry)
            print(f"ditgate serve: ran `ditgate {' '.join(request['argv'])}` in the server: exit {code}",
                  file=sys.stderr, flush=True)
            _send(conn, {"rc": code})
            return True
        if args is not None:
            served.keep_for(args, request["cwd"], request["argv"][0])
        gc.freeze()  # the command's collections walk only what it makes, not the server's heap (and leave its pages shared)
        pid = os.fork()
        if pid == 0:
            conn.close()
            served.forked(request, fds, entry)
        gc.unfreeze()  # the server's own collections see everything again
        for fd in fds:
            os.close(fd)
        try:
            watched = [conn, os.pidfd_open(pid)]  # the second is readable as soon as the command ends
        except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): the loop looks every 0.2 s
            watched = [conn]
        try:
            while True:
                ended, status = os.waitpid(pid, os.WNOHANG)
                if ended:
                    code = os.waitstatus_to_exitcode(status)
                    print(f"ditgate serve: ran `ditgate {' '.join(request['argv'])}`: exit {code}",
                          file=sys.stderr, flush=True)
                    _send(conn, {"rc": code})
                    return True
                ready, _, _ = select.select(watched, [], [], 0.2)
                if conn in ready and not conn.recv(1, socket.MSG_PEEK):  # the client went away: end its command
                    try:
                        os.killpg(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                    os.waitpid(pid, 0)
                    return True
        finally:
            for fd in watched[1:]:
                os.close(fd)


# what a run imports on its way (its rows, worker ranks, judging and report), imported once in the server
WARM_MODULES = ("ditgate.run.runner", "ditgate.run.exec.execute", "ditgate.run.exec.launch", "ditgate.run.exec.compat",
                "ditgate.run.exec.worker", "ditgate.run.judge.discrimination", "ditgate.run.judge.cache_off",
                "ditgate.run.judge.proofs", "ditgate.run.report.run_report", "ditgate.run.report.floor_report",
                "ditgate.run.report.grid", "ditgate.run.report.junit", "ditgate.run.diff.compare", "ditgate.run.reuse",
                "ditgate.run.define.predict", "ditgate.inspect.flops.profile", "ditgate.metrics.image",
                "ditgate.checklists", "cache_dit.distributed.core._templated_ring", "jsonschema",
                "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker")


def warm_imports() -> None:
    """What every command would import, imported once in the server; cache-dit's planner registries filled (as every
    parallel rank fills them first: each rank would otherwise import every planner module again)."""
    import importlib

    import cache_dit  # noqa: F401
    import diffusers  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional library missing: the command that needs it says so
            pass
    from ditgate.core.logs import quiet_libraries
    from ditgate.core.plugin import activate_cache_dit_planners

    from ditgate.run.report.run_report import schema_validator

    activate_cache_dit_planners()
    schema_validator()  # the report schema checked once here, not by every run
    quiet_libraries()  # the loggers these imports made, at the verbosity's level: a command sets only what differs


def serve(idle: float, entry, inline: bool = False) -> int:
    """Serve until idle or stopped; `entry(argv) -> exit status` runs one command (the CLI's main)."""
    _private_folder(create=True)
    path = socket_path()
    live = _connect()
    if live is not None:
        live.close()
        raise DitgateError(f"a ditgate server is already running on {path} (stop it with `ditgate serve --stop`)")
    path.unlink(missing_ok=True)  # a stale socket: nobody listens on it
    warm_imports()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(8)
    listener.settimeout(idle)
    print(f"ditgate serve: listening on {path} (pid {os.getpid()}; idle timeout {idle:g} s)", file=sys.stderr,
          flush=True)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                print("ditgate serve: idle, exiting", file=sys.stderr)
                return 0
            conn.settimeout(None)
            try:
                if not _serve_one(conn, entry, inline):
                    return 0
            except (OSError, ValueError):
                continue  # a client that broke off; the next one is served
    finally:
        listener.close()
        path.unlink(missing_ok=True)


def stop() -> int:
    conn = _connect()
    if conn is None:
        print("ditgate serve: no server is running", file=sys.stderr)
        return 0
    with conn, conn.makefile("rb") as reader:
        _receive(conn, reader)
        _send(conn, {"stop": True})
        reply = _receive(conn, reader) or {}
    for _ in range(50):  # it removes its socket as it exits
        if not socket_path().exists():
            break
        time.sleep(0.1)
    print(f"ditgate serve: stopped (pid {reply.get('stopped')})", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    if args.stop:
        return stop()
    if not 0 < args.idle <= MAX_IDLE:  # nan and inf too: a socket's timeout must fit the platform's time_t
        raise DitgateError(f"--idle must be a positive number of seconds up to {MAX_IDLE:,}, got {args.idle}")
    return serve(args.idle, args.entry, args.inline)
