"""Capturing the steps never changes what a pipeline does (ditgate.core.steps, through the row probes).

FluxPipeline subclasses of tests/pipelines/scheduler_pipelines.py on the zoo:flux weights: a scheduler deep-copied
per stream (before: IndexError, the copy stepped the original scheduler), a shallow copy, a second scheduler of
its own, and a loop that steps itself. Each call with the probes attached gives bit for bit the output of the same
call without them; the steps of the pipeline's own scheduler are counted, no other's; the scheduler gets its class
back afterwards. Full tier: a CP row of `ditgate run` passes on the deep-copying pipeline.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from ditgate.core.model import Model
from ditgate.run.exec.execute import generate
from ditgate.run.exec.outputs import decoded
from ditgate.run.exec.probes import Probes

PIPELINES = Path(__file__).parent / "pipelines"
STEPS = 4


@pytest.fixture(scope="module")
def flux():
    """zoo:flux's components, loaded once, and the request (32x32, 4 steps) every variant is called with."""
    model = Model.open("zoo:flux", height=32, width=32, steps=STEPS)
    return model.load().components, model.request


@pytest.mark.parametrize("name, own_steps", [  # fast tier: the two copies, which failed before
    ("SchedulerPerStream", STEPS), ("ShallowCopyPerStream", STEPS),
    pytest.param("SeveralSchedulers", STEPS, marks=pytest.mark.full), pytest.param("StepsItself", 0, marks=pytest.mark.full)])
def test_capture_leaves_the_pipeline_as_it_is(flux, name, own_steps, monkeypatch):
    monkeypatch.syspath_prepend(str(PIPELINES))
    import scheduler_pipelines

    components, request = flux
    pipe = getattr(scheduler_pipelines, name)(**components)
    scheduler_class = type(pipe.scheduler)
    plain, _ = decoded(generate(pipe, request, Probes()))  # no probes attached: nothing captured
    probes = Probes().attach(pipe)
    try:
        captured, _ = decoded(generate(pipe, request, probes))
    finally:
        probes.detach()
    assert type(pipe.scheduler) is scheduler_class and "step" not in vars(pipe.scheduler)
    assert np.array_equal(plain, captured), f"{name}: the capture changed the output"
    facts = probes.facts(STEPS)
    assert facts["scheduler_steps"] == own_steps and facts["transformer_calls"] == STEPS
    latents, source = probes.final_latents()
    assert source == "callback" and latents.shape[1] == 64  # 32x32: 64 packed tokens
    if own_steps:  # the scheduler saw the first stream only: its first half of the tokens
        assert torch.equal(probes.scheduler_steps.last_sample, latents[:, :32])


@pytest.mark.full
def test_cp_row_runs_on_a_pipeline_that_copies_its_scheduler(tmp_path, run_cli, monkeypatch):
    monkeypatch.syspath_prepend(str(PIPELINES))
    code, out, err = run_cli("run", "zoo:flux", "--pipeline", "scheduler_pipelines:SchedulerPerStream", "--rows",
                             "cp-ulysses-2", "--height", "32", "--width", "32", "--steps", str(STEPS),
                             "--out", tmp_path / "run")
    assert code == 0, out + err[-3000:]


def test_the_recording_scheduler_keeps_its_class_for_type_tests():
    """Bria's pipeline calls `scale_model_input` unless `type(self.scheduler) == FlowMatchEulerDiscreteScheduler`
    (FlowMatch has none): during the capture the scheduler's type still compares equal to its class, hashes like
    it, and a table keyed by it finds it; afterwards it has its class back."""
    from types import SimpleNamespace

    from diffusers import FlowMatchEulerDiscreteScheduler

    from ditgate.core.steps import SchedulerSteps

    scheduler = FlowMatchEulerDiscreteScheduler()
    with SchedulerSteps(SimpleNamespace(scheduler=scheduler)) as steps:
        assert steps._installed and type(scheduler) is not FlowMatchEulerDiscreteScheduler  # the recording class
        assert type(scheduler) == FlowMatchEulerDiscreteScheduler and not type(scheduler) != FlowMatchEulerDiscreteScheduler
        assert FlowMatchEulerDiscreteScheduler == type(scheduler) and isinstance(scheduler, FlowMatchEulerDiscreteScheduler)
        assert {FlowMatchEulerDiscreteScheduler: "found"}[type(scheduler)] == "found"
        assert type(scheduler) != object
    assert type(scheduler) is FlowMatchEulerDiscreteScheduler


def test_capture_keeps_the_steps_parameters_for_the_pipeline_to_read():
    """HunyuanDiT's pipeline hands the scheduler its generator only when `"generator"` is among the parameters of
    `scheduler.step` (diffusers' prepare_extra_step_kwargs); DDPM draws each step's noise from it. The recording
    step keeps the class's own signature, so a call with the probes attached gives bit for bit the output of the
    same call without them. With a bare `(*args, **kwargs)` signature (before), the noise came from the global
    generator: zoo:pipe/hunyuandit's final latents were off by max-abs 2.0 between two identical calls, and every
    row of `ditgate run` (cp-ulysses-2, tp-2 on the survey) failed against its baseline."""
    import inspect

    model = Model.open("zoo:pipe/hunyuandit", height=64, width=64, steps=2)
    pipe = model.load()
    plain, _ = decoded(generate(pipe, model.request, Probes()))
    probes = Probes().attach(pipe)
    try:
        assert "generator" in inspect.signature(pipe.scheduler.step).parameters
        captured, _ = decoded(generate(pipe, model.request, probes))
    finally:
        probes.detach()
    assert probes.facts(2)["scheduler_steps"] == 2
    assert np.array_equal(plain, captured), "the capture changed the output"
