"""Errors a user can cause. The CLI prints their message and exits with status 2."""


# The exit status of a command whose rows neither all passed nor any failed: at least one row could not be judged
# (`inconclusive` in report.json: a gate that cannot tell on these weights, see ditgate.run.judge.volatility).
EXIT_INCONCLUSIVE = 3


class DitgateError(Exception):
    """Base class: a problem with the user's input, explained in the message."""


class ModelNotFoundError(DitgateError, FileNotFoundError):
    """The model path does not exist."""


class NotAPipelineError(DitgateError):
    """The folder exists but holds no `model_index.json`."""


class PipelineClassError(DitgateError):
    """The pipeline class is unknown or cannot be imported."""


class ModelLoadError(DitgateError):
    """The model folder cannot be loaded as it is (weights that do not match their config.json): a user error, which
    ends a run before its first row instead of failing every row."""


class RemoteCodeError(DitgateError):
    """Loading would execute code shipped inside the model folder, and that was not allowed."""


class UnknownZooModelError(DitgateError, KeyError):
    """A `zoo:NAME` spec names no zoo model."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class MetricInputError(DitgateError, ValueError):
    """Inputs a metric cannot score correctly: mismatched shapes, an ambiguous layout, an unknown value range,
    an image smaller than the SSIM window."""


class NonFiniteError(MetricInputError):
    """An input holds NaN or Inf. `which` names the input ("baseline", "candidate", ...), `kind` is "NaN" or "Inf"."""

    def __init__(self, which: str, kind: str):
        super().__init__(f"{which} contains {kind}")
        self.which = which
        self.kind = kind


class GateConfigError(DitgateError):
    """`checklists/gates.json` (or the file given instead) is missing or does not follow its schema."""


class GateInputError(DitgateError, ValueError):
    """A gate cannot be evaluated as asked: unknown phase or modality, no check for that modality, or a check
    that needs an input that was not given (e.g. the initial noise for `disp_rel_error`)."""


class PipelineRunError(DitgateError):
    """Running the pipeline (to observe it) failed, or it has nothing to observe."""
