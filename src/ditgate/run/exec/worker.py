"""One rank of a worker group: `python -m torch.distributed.run ... -m ditgate.run.exec.worker JOB.json`, or a rank
forked from the run's own process (`forked`, on CPU: it inherits the imports and the pristine pipeline).

Every rank loads the model once (a forked rank has it already), runs each row of the job in turn on a copy of it and
generates; rank 0 stores the outputs. Each rank keeps a status file (row and stage, refreshed at every stage) so the
launcher can tell a hung rank from a slow one, and writes its traceback to an error file before exiting when a row
fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from ditgate.run.exec import lifeline
from ditgate.run.exec.files import write_json


def status_path(group_dir: Path, rank: int) -> Path:
    return group_dir / f"rank{rank}.status.json"


def error_path(group_dir: Path, rank: int) -> Path:
    return group_dir / f"rank{rank}.error.json"


def main(job_file: str) -> int:
    job = json.loads(Path(job_file).read_text())
    lifeline.die_with_parent()  # SIGKILL when torchrun dies
    lifeline.watch_parents(job.get("owner_pid"))  # and exit when `ditgate run` is gone
    return serve(job, int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)))


def warm_calls(warmup: int, row, warmed: bool) -> int:
    """The warm-up calls `row` makes: none once its process is warm (`warmed`), except a compiled row, whose first
    call compiles it (the runner and every rank of a worker group follow this one rule)."""
    return 0 if warmed and not row.compile else warmup


def cpu_threads(world_size: int) -> str:
    """Threads per CPU rank started by torchrun: the machine's cores shared evenly (torchrun's default of one thread
    leaves a large machine idle: a twin's ranks beside a GPU run on 16 cores)."""
    return str(max(1, (os.cpu_count() or 1) // max(1, world_size)))


def forked(job: dict, rank: int, world_size: int, port: int, pristine, log_fd: int) -> int:
    """The body of a rank forked from the run's process (ditgate.run.exec.launch): the environment torchrun would give
    it (one thread per rank unless OMP_NUM_THREADS says otherwise: a child forked from a process whose OpenMP pool
    has run must not start its own, it can hang), then `serve`. A CPU rank never sees a GPU (ditgate.run.exec.launch).
    """
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                      CUDA_VISIBLE_DEVICES="")
    lifeline.die_with_parent()  # SIGKILL when the run's process dies
    lifeline.watch_parents(job.get("owner_pid"))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return serve(job, rank, rank, pristine=pristine)


def serve(job: dict, rank: int, local_rank: int, pristine=None) -> int:
    """Run every row of `job` on this rank; 0 when all of them ran. `pristine`: the pipeline already loaded (a
    forked rank); None loads it once here, or for every row when the job says `launch: per-row`."""
    group_dir = Path(job["group_dir"])
    current = {"row": None, "stage": "start"}

    def stage(name: str) -> None:
        current["stage"] = name
        write_json(status_path(group_dir, rank), {"rank": rank, "row": current["row"], "stage": name,
                                                  "time": time.time(), "pid": os.getpid()})

    try:
        stage("import")
        import torch
        import torch.distributed as dist

        from ditgate.run.exec import compat
        from ditgate.run.exec import execute
        from ditgate.core import plugin
        from ditgate.core.model import Model
        from ditgate.run.define import rows

        from ditgate.core.logs import library_logs_to_stderr

        library_logs_to_stderr()
        stage("init-process-group")
        model = Model.from_dict(job["model"])
        on_cuda = model.device.startswith("cuda")
        if on_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl" if on_cuda else "gloo")
        if not on_cuda:
            stage("cpu-patches")
            compat.apply_cpu_patches()
        stage("load-integration")
        integration = plugin.load(job.get("integration"))
        run_dir = Path(job["run_dir"])
        # the group's start, paid by its first row: process starts, imports, process group
        once = {"launch_s": time.time() - job["launched_at"] if job.get("launched_at") else 0.0, "load_s": job.get("parent_load_s", 0.0)}
        if pristine is None and job.get("launch") != "per-row":
            stage("load")
            pristine = execute.load_pristine(model, local_rank=local_rank)
            once["load_s"] = pristine.load_s
        warmed = False  # warm-up once per rank process (job "warm_once"), not per row; a compiled row compiles
        for index, data in enumerate(job["rows"]):
            row = rows.from_mapping({k: v for k, v in data.items() if k != "world_size"})
            current["row"] = row.name
            if pristine is not None and index == len(job["rows"]) - 1:
                pristine.last_row()  # this rank ends after the row: it may run on the pristine pipeline itself
            calls = warm_calls(job["warmup"], row, warmed and job.get("warm_once", True))
            warmed = warmed or calls > 0
            outcome = execute.run_row(row, model, integration=integration, warmup=calls,
                                      repeats=job["repeats"], local_rank=local_rank, on_stage=stage,
                                      pristine=pristine)
            outcome.overhead["launch_s"] = once["launch_s"]
            outcome.overhead["load_s"] += once["load_s"]
            once = {"launch_s": 0.0, "load_s": 0.0}
            stage("barrier")
            dist.barrier()
            if rank == 0:
                execute.save_outcome(run_dir, row, outcome)
            stage("done")
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the report
        write_json(error_path(group_dir, rank), {
            "rank": rank, "row": current["row"], "stage": current["stage"], "type": type(exc).__name__,
            "message": str(exc), "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
