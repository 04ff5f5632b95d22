"""Values the skill hands cache-dit must be accepted by the installed version (part of the `api` rule).

- A string literal given as a keyword argument to a cache-dit / diffusers callable: when the parameter is annotated
  with an Enum (alone or in a union), the string must name one of its members (name or value, any case); when the
  keyword has a value domain on cache-dit's command line (`quant_type` -> `--quantize-type`, `ring_rotate_method`
  -> `--ring-rotate-method`), it must be one of that option's choices. `QuantizeConfig(quant_type="bnb_4bit")`
  fails: the installed name is `bitsandbytes_4bit`.
- `NAME="value"` written alone in a code span, for such a keyword NAME: the same.
- `cache-dit-generate ...`, `python -m cache_dit.generate ...` and `torchrun ... -m cache_dit.generate ...` lines in
  shell fences and code spans, and code spans that start with an option only cache-dit's command line has
  (`--quantize-type bitsandbytes_4bit`): their options and choices must parse with cache-dit's own command-line
  parser (the example name is not judged: the reader's own example is not registered yet).
"""

from __future__ import annotations

import argparse
import ast
import enum
import functools
import shlex
import typing
from collections.abc import Iterator
from typing import Any

from ditgate.skill.base import Problem, Skill
from ditgate.skill.rules.commandlines import SHELL_FENCES, command_words, logical_lines, parse_error

# keyword argument of cache-dit's API -> the `dest` of cache-dit's command-line option that takes the same values
CLI_DOMAINS = {"quant_type": "quantize_type", "ring_rotate_method": "ring_rotate_method"}
GENERATE_MODULE = "cache_dit.generate"
GENERATE_PROGRAM = "cache-dit-generate"


@functools.lru_cache(maxsize=1)
def cache_dit_parser() -> argparse.ArgumentParser | None:
    """cache-dit's `cache-dit-generate` parser: its base options plus the two positionals of `get_example_args`,
    without their choices. None when cache-dit cannot be imported."""
    try:
        from cache_dit._utils.utils import get_base_args
    except Exception:  # noqa: BLE001 - any failure means cache-dit's command line cannot be checked here
        return None
    parser = get_base_args(parse=False)
    parser.add_argument("task", nargs="?")
    parser.add_argument("example", nargs="?")
    parser.add_argument("--example-summary", "--esummary", action="store_true")
    return parser


def _cli_choices(dest: str) -> list[str] | None:
    parser = cache_dit_parser()
    if parser is None:
        return None
    for action in parser._actions:       # noqa: SLF001 - argparse keeps no public list of its actions
        if action.dest == dest and action.choices:
            return [choice for choice in action.choices if choice is not None]
    return None


def _enums(annotation: Any) -> list[type[enum.Enum]]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [annotation]
    return [e for arg in typing.get_args(annotation) for e in _enums(arg)]


def _annotation(obj: Any, keyword: str) -> Any:
    target = obj.__init__ if isinstance(obj, type) else obj
    try:
        return typing.get_type_hints(target).get(keyword)
    except Exception:  # noqa: BLE001 - unresolvable annotations: the value cannot be judged
        return None


def wrong_value(obj: Any, keyword: str, value: str) -> str | None:
    """Why `value` is not accepted for `keyword` of the cache-dit / diffusers callable `obj`, or None."""
    if keyword in CLI_DOMAINS:
        choices = _cli_choices(CLI_DOMAINS[keyword])
        if choices is not None and value not in choices:
            return f"`{keyword}={value!r}` is not a value cache-dit accepts (choose from {', '.join(choices)})"
    if obj is None:
        return None
    for klass in _enums(_annotation(obj, keyword)):
        known = {str(m.name).lower() for m in klass} | {str(m.value).lower() for m in klass}
        if value.lower() not in known:
            names = ", ".join(m.name for m in klass)
            return f"`{keyword}={value!r}` names no member of {klass.__name__} ({names})"
    return None


def wrong_keyword_values(obj: Any, call: ast.Call) -> list[str]:
    return [message for k in call.keywords
            if k.arg and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)
            and (message := wrong_value(obj, k.arg, k.value.value))]


def wrong_assignments(tree: ast.AST) -> list[tuple[int, str]]:
    """`quant_type="..."` written alone (a code span): checked against the keyword's domain."""
    found = []
    body = getattr(tree, "body", [])
    if len(body) == 1 and isinstance(body[0], ast.Assign) and isinstance(body[0].value, ast.Constant):
        node = body[0]
        value = node.value.value
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id in CLI_DOMAINS and isinstance(value, str):
                message = wrong_value(None, target.id, value)
                if message:
                    found.append((node.lineno, message))
    return found


def generate_invocations(line: str) -> list[list[str]]:
    """The argument lists of every cache-dit-generate command in a shell line."""
    found = []
    for words in command_words(line):
        if words[:1] == [GENERATE_PROGRAM]:
            found.append(words[1:])
            continue
        if "-m" in words and words[0].split("/")[-1].startswith(("python", "torchrun")):
            at = words.index("-m")
            if words[at + 1: at + 2] == [GENERATE_MODULE]:
                found.append(words[at + 2:])
    return found


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:       # noqa: SLF001
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):       # noqa: SLF001
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


@functools.lru_cache(maxsize=1)
def _cache_dit_only_options() -> frozenset[str]:
    """Options of cache-dit's command line that no ditgate command has (`--quantize-type`, `--attn`, ...)."""
    from ditgate.cli import build_parser

    parser = cache_dit_parser()
    if parser is None:
        return frozenset()
    return frozenset(_option_strings(parser) - _option_strings(build_parser()))


def _lines(skill: Skill) -> Iterator[tuple[str, int, str]]:
    """(file, line, shell text) for shell fence lines and code spans that may be commands. A code span that starts
    with an option only cache-dit's command line has (`--quantize-type bitsandbytes_4bit`) is read as its
    arguments."""
    for doc in skill.docs.values():
        for fence in doc.fences:
            if fence.language in SHELL_FENCES:
                for offset, text in logical_lines(fence.content):
                    yield doc.rel, fence.line + offset, text
        for span in doc.code_spans:
            if GENERATE_PROGRAM in span.text or GENERATE_MODULE in span.text:
                yield doc.rel, span.line, span.text
            elif len(span.text.split()) > 1 and span.text.split()[0] in _cache_dit_only_options():
                yield doc.rel, span.line, f"{GENERATE_PROGRAM} {span.text}"


def check_generate_commands(skill: Skill) -> Iterator[Problem]:
    parser = None
    for file, line, text in _lines(skill):
        try:
            invocations = generate_invocations(text)
        except ValueError:
            continue
        for args in invocations:
            parser = parser or cache_dit_parser()
            if parser is None:
                yield Problem(file, line, "cannot check cache-dit's command line: cache_dit cannot be imported",
                              warning=True)
                return
            message = parse_error(parser, args)
            if message and "$" not in message:
                yield Problem(file, line, f"`{GENERATE_PROGRAM} {shlex.join(args)}`: {message}")

