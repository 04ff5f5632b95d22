"""Errors a user can cause. The CLI prints their message and exits with status 2."""


class DitgateError(Exception):
    """Base class: a problem with the user's input, explained in the message."""


class ModelNotFoundError(DitgateError, FileNotFoundError):
    """The model path does not exist."""


class NotAPipelineError(DitgateError):
    """The folder exists but holds no `model_index.json`."""


class PipelineClassError(DitgateError):
    """The pipeline class is unknown or cannot be imported."""


class RemoteCodeError(DitgateError):
    """Loading would execute code shipped inside the model folder, and that was not allowed."""


class UnknownZooModelError(DitgateError, KeyError):
    """A `zoo:NAME` spec names no zoo model."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PipelineRunError(DitgateError):
    """Running the pipeline (to observe it) failed, or it has nothing to observe."""
