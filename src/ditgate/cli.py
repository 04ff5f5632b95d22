"""`ditgate` command line: one module per subcommand in `ditgate.commands.model` (commands that take a model) and
`ditgate.commands.tools` (the others).

A command module defines `HELP` (one line), `register(parser)` (adds its arguments) and `main(args) -> int`.
Modules import heavy libraries (torch, diffusers, cache-dit) inside `main`, so `ditgate --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import io
import importlib
import pkgutil
import re
import signal
import sys
import threading

from ditgate import __version__, commands
from ditgate.core import logs
from ditgate.core.errors import DitgateError


def command_modules() -> dict[str, object]:
    """Every subcommand's module by its command name: the modules of `ditgate.commands`' sub-packages that define
    `HELP` (the others, such as the shared options, are not commands)."""
    found = {}
    for group in pkgutil.iter_modules(commands.__path__):
        package = importlib.import_module(f"{commands.__name__}.{group.name}")
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            if hasattr(module, "HELP"):
                found[getattr(module, "NAME", info.name)] = module
    return found


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors name the nearest command or option to a misspelt one."""

    def error(self, message: str):
        super().error(message + _did_you_mean(self, message))


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """' (did you mean X?)' for an invalid choice or an unrecognized option close to one `parser` knows."""
    choice = re.match(r"argument .*: invalid choice: '(.*?)' \(choose from (.*)\)$", message)
    if choice:
        word, known = choice.group(1), re.findall(r"'(.*?)'", choice.group(2))
    else:
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if not unknown or not unknown.group(1).startswith("-"):
            return ""
        word = unknown.group(1).split("=")[0]
        known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    near = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ditgate", description="Check each phase of integrating a diffusion transformer into cache-dit.")
    parser.add_argument("--version", action="version", version=f"ditgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in sorted(command_modules().items()):
        child = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.register(child)
        child.set_defaults(func=module.main)
        _add_verbosity(child)
    return parser


def _add_verbosity(parser: argparse.ArgumentParser) -> None:
    """-q / -v on a command and on each of its actions (`zoo list -q`)."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subparsers:
        for child in subparsers[0].choices.values():
            _add_verbosity(child)
        return
    parser.set_defaults(_parser=parser)  # the parser that reports an unrecognized option (ditgate.cli.main)
    group = parser.add_argument_group("output")
    group.add_argument("-q", "--quiet", action="count", default=argparse.SUPPRESS,
                       help="print nothing when the command succeeds (its output and progress are shown on failure; "
                            "--json output is always printed); library messages: errors only")
    group.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                       help="show library warnings (-v) and library info lines (-vv) as they come")


def _verbosity(args: argparse.Namespace) -> int:
    return getattr(args, "verbose", 0) - getattr(args, "quiet", 0)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is: it ends like an interrupt (worker groups killed, nothing half-written)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _os_error(exc: OSError) -> str:
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        what = "disk full (no space left on the device): free some space and run again"
    return f"{where}: {what}" if where else what


def may_serve(argv: list[str]) -> bool:
    """Whether a running `ditgate serve` may run `argv`, read before any parser is built (the served command parses
    it, and reports what is wrong, as this process would): a command the server runs whose --server is not `off`.
    Anything unclear (a word the parser could read as --server, a `--`) is left to the parser."""
    from ditgate.commands.tools.served import WARM_COMMANDS

    if not argv or argv[0] not in WARM_COMMANDS or "--" in argv:
        return False
    for index, word in enumerate(argv):
        if word.startswith("--ser") and not (word == "--server=auto" or (word == "--server" and
                                                                          argv[index + 1:index + 2] == ["auto"])):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    asked = may_serve(argv)
    if asked:  # a running `ditgate serve` runs it warm (never required); this process builds no parser for it
        from ditgate.commands.tools import serve

        forwarded = serve.forward(argv)
        if forwarded is not None:
            return forwarded
    parser = build_parser()
    if not argv:  # `ditgate` alone: what it can do
        parser.print_help()
        return 0
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the command's own parser: its usage, and the nearest of its options
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "server", "off") == "auto" and not asked:  # as above, for a spelling only the parser reads
        from ditgate.commands.tools import serve

        forwarded = serve.forward(argv)
        if forwarded is not None:
            return forwarded
    args.entry = main  # a command that runs commands (`ditgate serve`) runs them through the CLI's own main
    level = _verbosity(args)
    logs.set_verbosity(level)
    held = io.StringIO() if level < 0 and not getattr(args, "json", False) else None
    code = 2
    try:
        with contextlib.redirect_stdout(held) if held is not None else contextlib.nullcontext():
            code = _run(args)
    finally:
        if held is not None and code != 0:
            sys.stdout.write(held.getvalue())
            sys.stdout.flush()
    return code


def _run(args: argparse.Namespace) -> int:
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.func(args) or 0)
    except DitgateError as exc:
        print(f"ditgate: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # a library the model's components need is not installed (diffusers says which)
        text = " ".join(str(exc).split())
        if "requires the" not in text or "library" not in text:
            raise
        print(f"ditgate: error: a component of the model needs a library that is not installed: {text}",
              file=sys.stderr)
        return 2
    except OSError as exc:  # the file system refused: a path that is a file, unwritable, a full disk
        print(f"ditgate: error: {_os_error(exc)}", file=sys.stderr)
        return 2
    except Terminated:
        print("ditgate: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("ditgate: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
