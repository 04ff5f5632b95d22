"""ditgate: the runtime behind the cache-dit model-integration skill.

It loads a pipeline offline, runs the single-device baseline and each integration phase through cache-dit, and
gates every output against the baseline with the thresholds of `checklists/gates.json`.
"""

__version__ = "0.1.0"


def load(model, dtype="float32", device="cpu", **kwargs):
    """Load a pipeline from a local folder or `zoo:NAME` (see `ditgate.core.loader.load`)."""
    from ditgate.core.loader import load as _load

    return _load(model, dtype=dtype, device=device, **kwargs)


__all__ = ["__version__", "load"]
