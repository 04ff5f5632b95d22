"""`ditgate serve` and `--server auto`: the same results as a command run in its own process, used only when a
live server of this user, this ditgate and this environment is there; a stale socket or a dead server is never
used (the command runs in its own process), a second server is refused, two clients at once both get their
results (one served, the other, finding it busy, in its own process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(home: Path) -> dict:
    return dict(os.environ, DITGATE_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT / "src"),
                                                                                os.environ.get("PYTHONPATH", "")]))


def _cli(env, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "ditgate", *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _done(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _untimed(value):
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items()
                if k not in ("run_dir", "times", "speedup", "speedup_caveats", "prediction", "peak_memory_bytes",
                             "overhead", "time", "wall_s", "media") and not k.endswith("_s")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


@pytest.mark.full  # a server's start and three runs: minutes on the 2-core machine
def test_server_runs_commands_as_a_fresh_process_would(zoo_path, tmp_path):
    zoo = zoo_path("flux")  # built once for the session (the server and clients share the session's home)
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(Path(zoo).parent, home / "zoo")
    env = _env(home)
    sock_dir = home / "serve"
    sock_dir.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_dir / "serve.sock"))
    stale.close()  # a socket file nobody listens on

    inspect = ["inspect", "zoo:flux", "--height", "64", "--width", "64", "--steps", "2", "--json"]
    code, alone, err = _done(_cli(env, *inspect))  # the stale socket is not used: the command runs by itself
    assert code == 0, err

    server = _cli(env, "serve", "--idle", "300")
    try:
        deadline = time.time() + 300
        while not any("listening" in line for line in [server.stderr.readline()]):
            assert server.poll() is None and time.time() < deadline, "the server did not start"
        assert _done(_cli(env, "serve"))[0] == 2  # one server at a time

        run = ["run", "zoo:flux", "--height", "64", "--width", "64", "--steps", "3", "--rows", "cache", "--json",
               "--fresh"]
        clients = [_cli(env, *run, "--out", tmp_path / "served"), _cli(env, *inspect)]  # two clients at once
        (code_run, served_run, err_run), (code_i, served_inspect, err_i) = (_done(c) for c in clients)
        assert code_i == 0 and json.loads(served_inspect) == json.loads(alone), err_i
        code_off, own_run, err_off = _done(_cli(env, *run, "--out", tmp_path / "own", "--server", "off"))
        assert code_run == code_off, (err_run, err_off)
        assert _untimed(json.loads(served_run)) == _untimed(json.loads(own_run))

        server.send_signal(signal.SIGKILL)  # a crashed server: its socket stays behind, and is not used
        server.wait()
        assert (sock_dir / "serve.sock").exists()
        code, after, err = _done(_cli(env, *inspect))
        assert code == 0 and json.loads(after) == json.loads(alone), err
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    log = server.stderr.read()
    # one command at a time: of the two clients at once one was served, the other found it busy and ran by itself
    assert log.count("ditgate serve: ran `ditgate") == 1
    assert log.count("keeping") == 1, log  # the served command's pipeline was loaded in the server, kept for the next


def test_which_commands_the_client_hands_over_before_parsing():
    from ditgate.cli import may_serve

    assert may_serve(["run", "zoo:flux", "--rows", "cache"]) and may_serve(["inspect", "m", "--server", "auto"])
    assert may_serve(["diff", "m", "--server=auto"]) and may_serve(["checklist", "m"])
    for argv in (["run", "m", "--server", "off"], ["run", "m", "--serv", "auto"], ["run", "m", "--server=off"],
                 ["zoo", "list"], ["serve"], [], ["run", "--", "m"]):
        assert not may_serve(argv), argv  # not served, or left to the parser to read


def test_stop_and_a_folder_not_private(tmp_path):
    env = _env(tmp_path / "home")
    (tmp_path / "home" / "serve").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "home" / "serve", 0o755)
    code, _, err = _done(_cli(env, "serve", "--idle", "5"))
    assert code == 2 and "private" in err
    code, _, err = _done(_cli(env, "serve", "--stop"))
    assert code == 0 and "no server" in err


def test_a_kept_pipeline_is_the_one_a_load_gives(zoo_path, tmp_path):
    """What the server keeps loaded (ditgate.core.warm) is taken by the next load of the same folder, dtype and
    class, once; a folder whose files changed since is read again; code from the model folder is never kept."""
    import shutil

    import torch

    from ditgate.core import loader, warm

    folder = tmp_path / "flux"
    shutil.copytree(zoo_path("flux"), folder)
    def keep():
        if not warm.has(folder, torch.float32, None):
            warm.keep(folder, torch.float32, None, loader.load(folder, "float32", "cpu", warm=False))

    keep()
    assert warm.has(folder, torch.float32, None)
    fresh = loader.load(folder, "float32", "cpu", warm=False)
    kept = loader.load(folder, "float32", "cpu")
    assert not warm.kept()  # handed over once
    for (name, a), (_, b) in zip(kept.transformer.state_dict().items(), fresh.transformer.state_dict().items()):
        assert torch.equal(a, b), name
    assert loader.load(folder, "float32", "cpu") is not kept  # the next load reads the folder
    keep()
    assert loader.load(folder, "bfloat16", "cpu").transformer.dtype == torch.bfloat16  # another dtype: not taken
    config = folder / "scheduler" / "scheduler_config.json"
    config.write_text(config.read_text().replace("{", '{"edited": 1, ', 1))
    assert loader.load(folder, "float32", "cpu") is not None and warm.kept()  # changed folder: the kept one unused
    warm.drop()
    # a run in a process that runs commands one after another (a GPU command in the server) gives back its pristine
    # pipeline, under the key taken before its load; the next load takes it once; any other load lets it go
    load_key = warm.key(folder, torch.float32, None)
    pipe = loader.load(folder, "float32", "cpu")
    assert not warm.give_back(load_key, pipe) and not warm.kept()  # not such a process: nothing kept
    warm.between_commands(True)
    try:
        assert warm.give_back(load_key, pipe) and loader.load(folder, "float32", "cpu") is pipe
        assert loader.load(folder, "float32", "cpu") is not pipe
        warm.give_back(load_key, pipe)  # a load of anything else lets it go (its memory: a GPU's, in such a process)
        assert loader.load(folder, "bfloat16", "cpu") is not pipe and not warm.kept()
    finally:
        warm.between_commands(False)
        warm.drop()


@pytest.mark.full  # a server's start and three runs
def test_a_command_run_in_the_server_gives_the_fresh_result_and_gives_back_its_streams(zoo_path, tmp_path):
    """`--inline` (what a GPU command always gets: a forked child cannot use the CUDA state the imports made): the
    command runs in the server's own process on the client's streams and folder; its result is a fresh process's,
    and the server, its streams and environment put back, serves the next command the same."""
    zoo = zoo_path("flux")
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(Path(zoo).parent, home / "zoo")
    env = _env(home)
    server = _cli(env, "serve", "--idle", "300", "--inline")
    try:
        while "listening" not in server.stderr.readline():
            assert server.poll() is None, "the server did not start"
        run = ["run", "zoo:flux", "--height", "64", "--width", "64", "--steps", "3", "--rows", "cache", "--json",
               "--fresh", "--twin", "off"]
        served = [_done(_cli(env, *run, "--out", tmp_path / f"served{i}", cwd=tmp_path)) for i in range(2)]
        code_off, own_run, err_off = _done(_cli(env, *run, "--out", tmp_path / "own", "--server", "off"))
        for code, out, err in served:
            assert code == code_off, err
            assert _untimed(json.loads(out)) == _untimed(json.loads(own_run))
        # the second run took the pipeline the first gave back (ditgate.core.warm): no load from the folder
        loads = [json.loads(out)["time"]["load_s"] for _, out, _ in served]
        assert loads[1] < 0.05 < loads[0], loads
        assert _done(_cli(env, "run", "zoo:flux", "--rows", "nope"))[0] == 2  # a user error, served: one line, 2
        assert _done(_cli(env, "serve", "--stop"))[0] == 0
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    log = server.stderr.read()
    assert log.count("in the server: exit") == 3 and "for the next command that loads it" in log
