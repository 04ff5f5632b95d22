"""The `command` rule: `ditgate` command lines in the skill's shell fences must parse with ditgate's own CLI.

A fence whose info string is `bash runnable` is run by CI; every `ditgate ...` line in it must parse with
`ditgate.cli.build_parser()` (known subcommand and flags) or it is an error. In other shell fences an unknown
subcommand or flag is a warning (a planned command may be shown there). An inline code span that starts with
`ditgate ` may be a partial command: its subcommand, options and option choices are checked (errors), not what it
leaves out. Values holding shell variables (`$MODEL`) and placeholders (`--height H`, `--phase PHASE`, `<model>`)
are not judged, and usage-style optional groups (`[--steps N]`) are dropped.
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

from ditgate.skill.base import Problem, Skill

SHELL_FENCES = ("bash", "sh", "shell", "zsh", "console")
RUNNABLE = "runnable"
_PLACEHOLDER = re.compile(r"<[A-Za-z][\w.-]*>")
_OPTIONAL_GROUP = re.compile(r"\[\s*-[^\]]*\]")
_UNJUDGED_WORD = re.compile(r"^(?:[A-Z][A-Z0-9_]*|.*\$.*|PLACEHOLDER)$")
_UNJUDGED_VALUE = re.compile(r"invalid [\w ]*(?:value|choice): '([A-Z][A-Z0-9_]*|[^']*\$[^']*)'")
_REDIRECT = re.compile(r"(?<!\S)\d*(?:>>?|<)(?:&\d+|\s*[^\s;&|]+)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SEPARATORS = set("();&|")
_PYTHON = re.compile(r"^(?:.*/)?python[\d.]*$|^\$\{?PY\}?$")


def logical_lines(content: str) -> Iterator[tuple[int, str]]:
    """(offset of the first physical line, text) with backslash continuations joined and prompts dropped."""
    pending, start = "", 0
    for offset, line in enumerate(content.split("\n")):
        if not pending:
            start = offset
            line = re.sub(r"^\s*\$\s+", "", line)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def command_words(line: str) -> list[list[str]]:
    """The words of every simple command in a shell line (placeholders, redirections, usage-style optional groups
    and leading `VAR=value`, `time`, `env`, `exec` dropped)."""
    text = _REDIRECT.sub(" ", _PLACEHOLDER.sub("PLACEHOLDER", _OPTIONAL_GROUP.sub(" ", line)))
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    segments: list[list[str]] = [[]]
    for token in tokens:
        if set(token) <= _SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    commands = []
    for words in segments:
        while words and (_ASSIGNMENT.match(words[0]) or words[0] in ("time", "env", "exec")):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def ditgate_invocations(line: str) -> list[list[str]]:
    """The argument lists of every `ditgate ...` / `python -m ditgate ...` command in a shell line."""
    found = []
    for words in command_words(line):
        if words[:1] == ["ditgate"]:
            found.append(words[1:])
        elif len(words) >= 3 and _PYTHON.match(words[0]) and words[1:3] == ["-m", "ditgate"]:
            found.append(words[3:])
    return found


def _argparse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    errors = io.StringIO()
    try:
        with redirect_stderr(errors), redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        lines = errors.getvalue().strip().splitlines()
        return lines[-1].split("error: ", 1)[-1] if lines else "does not parse"
    return None


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """argparse's complaint about `ditgate ARGS`, or None when it parses.

    A value argparse rejects that is a placeholder (`H`, `PHASE`) or holds a shell variable is swapped for one it
    accepts (the first choice, or a number) and the line parsed again, so the flags after it are still checked.
    """
    args = list(args)
    for _ in range(len(args) + 1):
        message = _argparse_error(parser, args)
        match = _UNJUDGED_VALUE.search(message or "")
        if match is None:
            return message
        choices = re.search(r"choose from '([^']*)'", message)
        stand_in = (choices.group(1) if choices else "1" if "invalid int value" in message
                    else "1.0" if "invalid float value" in message else None)
        if stand_in is None or match.group(1) not in args:
            return None          # a placeholder for a value of a type we cannot make up: not judged
        args[args.index(match.group(1))] = stand_in
    return None


def _subparser(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The deepest subcommand parser `args` names, and the arguments after its name."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]    # noqa: SLF001
        if not subs or not args or args[0] not in subs[0].choices:
            return parser, args
        parser, args = subs[0].choices[args[0]], args[1:]


def flag_errors(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """Options of a partial command line (a code span: `ditgate run --rows cache`) its subcommand does not have,
    and values outside an option's choices. Missing arguments are not judged."""
    sub, rest = _subparser(parser, args)
    if sub is parser and args and not args[0].startswith("-"):
        return [f"no ditgate command `{args[0]}`"]
    options = {o: a for a in sub._actions for o in a.option_strings}      # noqa: SLF001
    errors = []
    for index, word in enumerate(rest):
        if not word.startswith("--"):
            continue
        name, _, inline = word.partition("=")
        action = options.get(name)
        if action is None:
            errors.append(f"`ditgate {' '.join(args[:len(args) - len(rest)])}` has no option {name}")
            continue
        value = inline or (rest[index + 1] if index + 1 < len(rest) else None)
        if action.choices and value and not value.startswith("-") and value not in action.choices \
                and not _UNJUDGED_WORD.match(value):
            errors.append(f"{name} {value}: not one of {', '.join(map(str, action.choices))}")
    return errors


def check_commands(skill: Skill) -> Iterator[Problem]:
    from ditgate.cli import build_parser

    parser = build_parser()
    for doc in skill.docs.values():
        for fence in doc.fences:
            if fence.language not in SHELL_FENCES:
                continue
            warning = RUNNABLE not in fence.flags
            for offset, line in logical_lines(fence.content):
                number = fence.line + offset
                try:
                    invocations = ditgate_invocations(line)
                except ValueError as exc:
                    if "ditgate" in line:
                        yield Problem(doc.rel, number, f"cannot split this shell line: {exc}", warning=warning)
                    continue
                for args in invocations:
                    message = parse_error(parser, args)
                    if message and "$" not in message:
                        yield Problem(doc.rel, number, f"`ditgate {shlex.join(args)}`: {message}", warning=warning)
        for span in doc.code_spans:
            if not span.text.startswith(("ditgate ", "python -m ditgate ")):
                continue
            try:
                invocations = ditgate_invocations(span.text)
            except ValueError:
                continue
            for args in invocations:
                for message in flag_errors(parser, args):
                    yield Problem(doc.rel, span.line, f"`{span.text}`: {message}")
