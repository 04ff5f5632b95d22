"""Two gloo ranks forked from the test's process, for tests that shard or gather by hand."""

import multiprocessing

from ditgate.run.exec.launch import _free_port


def run_on_two_ranks(target, args: tuple, timeout: float) -> tuple[dict, list]:
    """Forks two processes running `target(rank, port, *args, result)` (`result`: a dict shared with this process)
    and waits up to `timeout` s for each: (what they put in `result`, their exit codes)."""
    port = _free_port()
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        result = manager.dict()
        procs = [ctx.Process(target=target, args=(rank, port, *args, result)) for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        return dict(result), [p.exitcode for p in procs]
