"""Calls of a built twin: the whole call, and a call cut short after the first transformer forward.

A short call runs the pipeline up to its first transformer call and stops there (a forward hook raises), reading
the tokens entering each block list's first block and the transformer's output: what the call search
(`ditgate.twin.call`) needs, at the cost of the text encoders and one transformer forward.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from ditgate.core import modular, request as request_mod
from ditgate.core.components import transformers_of


class _Stop(Exception):
    """Raised by the hook once the first transformer call has been seen."""


@dataclass
class Seen:
    tokens: dict[str, int] = field(default_factory=dict)  # "transformer.blocks" -> tokens entering block 0
    output: Any = None  # the first transformer call's first output tensor
    transformer: str | None = None  # which transformer made it
    calls: dict[str, int] = field(default_factory=dict)  # forward calls per transformer
    result: Any = None  # what the call returned (whole calls)

    @property
    def main_tokens(self) -> int | None:
        """Tokens entering the longest block list's first block of the first transformer called."""
        if not self.tokens:
            return None
        return self.tokens[max(self.tokens, key=lambda k: self.tokens[k] if self.transformer and
                               k.startswith(self.transformer + ".") else -1)]


def first_tensor(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict) or hasattr(value, "to_tuple"):
        value = list(value.values()) if isinstance(value, dict) else value.to_tuple()
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def invoke(pipe, req: request_mod.Request, seed: int):
    """One call of `pipe` with the request (the same arguments and generator as a run's rows)."""
    import torch

    generator = torch.Generator("cpu").manual_seed(seed)
    if modular.is_modular_class(type(pipe)):
        image = request_mod.input_image(req)
        return modular.call(pipe, req.call, generator, None if image is None else {req.image_key: image})
    kwargs = request_mod.call_kwargs(pipe, req)
    if "output_type" in inspect.signature(type(pipe).__call__).parameters:
        kwargs["output_type"] = "np"
    with torch.no_grad():
        return pipe(**kwargs, generator=generator)


def call(pipe, req: request_mod.Request, seed: int = 0, short: bool = False) -> Seen:
    """Call `pipe`; `short`: stop after the first transformer call."""
    from ditgate.core.components import block_lists

    seen = Seen()
    handles = []
    for name, transformer in transformers_of(pipe).items():
        seen.calls[name] = 0
        for path, blocks in block_lists(transformer).items():
            handles.append(blocks[0].register_forward_pre_hook(_tokens_hook(seen, f"{name}.{path}"), with_kwargs=True))
        handles.append(transformer.register_forward_hook(_output_hook(seen, name, short)))
    seen.result = _call_hooked(pipe, req, seed, handles, short)
    return seen


def text_tokens(pipe, req: request_mod.Request, seed: int = 0) -> list[tuple[int, int]]:
    """(tokens let through, input length) of each text encoder call that took an attention mask (a chat template's
    system message counts), read by a call stopped before the first transformer forward: the prompt left padding
    where the first is below the second."""
    import torch

    seen: list[tuple[int, int]] = []

    def encoder_hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            seen.append((int(mask.sum(-1).max()), int(mask.shape[-1])))

    def stop(module, args, kwargs):
        raise _Stop()

    comps = getattr(pipe, "components", {})
    handles = [m.register_forward_pre_hook(encoder_hook, with_kwargs=True) for n, m in comps.items()
               if "encoder" in n and isinstance(m, torch.nn.Module)]
    handles += [t.register_forward_pre_hook(stop, with_kwargs=True) for t in transformers_of(pipe).values()]
    _call_hooked(pipe, req, seed, handles, True)
    return seen


def _call_hooked(pipe, req: request_mod.Request, seed: int, handles: list, short: bool):
    """The pipeline's call with `handles` hooked (removed after it); its result, or None where a hook stopped it."""
    try:
        with _modular_logs_off(short):
            return invoke(pipe, req, seed)
    except _Stop:
        return None
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _modular_logs_off(short: bool):
    """A modular pipeline logs every exception raised in a block with its traceback before raising it again: the
    stop of a short call is no error."""
    log = logging.getLogger("diffusers.modular_pipelines")
    level = log.level
    if short:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _tokens_hook(seen: Seen, key: str):
    def hook(module, args, kwargs):
        if key in seen.tokens:
            return
        hidden = args[0] if args else kwargs.get("hidden_states")
        hidden = first_tensor(hidden)
        if hidden is not None and hidden.dim() == 3:
            seen.tokens[key] = int(hidden.shape[1])
    return hook


def _output_hook(seen: Seen, name: str, short: bool):
    def hook(module, args, output):
        seen.calls[name] += 1
        if seen.output is None:
            tensor = first_tensor(output)
            seen.output = None if tensor is None else tensor.detach().clone()
            seen.transformer = name
        if short:
            raise _Stop()
    return hook


def modality(pipe, result) -> str:
    """image, video or audio: by the name of what the call returned."""
    if modular.is_modular_class(type(pipe)):
        return modular.output_name(pipe, {})[1]
    names = set(vars(result)) if hasattr(result, "__dict__") else set()
    if names & {"frames", "videos", "video"}:
        return "video"
    if names & {"audios", "audio"}:
        return "audio"
    return "image"


def decoder_calls(vae, latents, tiling: dict[str, Any] | None) -> int:
    """How many times the VAE's decoder runs to decode `latents` (with `tiling`, the arguments of enable_tiling)."""
    import torch

    decoder = getattr(vae, "decoder", None)
    if decoder is None:
        return 0
    counter = {"n": 0}

    def hook(module, args, output):
        counter["n"] += 1

    handle = decoder.register_forward_hook(hook)
    try:
        if tiling is not None:
            vae.enable_tiling(**tiling)
        with torch.no_grad():
            vae.decode(latents)
    finally:
        handle.remove()
        if tiling is not None:
            vae.disable_tiling()
    return counter["n"]
