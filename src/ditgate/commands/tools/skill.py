"""`ditgate skill install --target DIR [--layout agents|github|claude|all] [--link] [--force]`."""

from __future__ import annotations

import argparse

HELP = "install the skill into a project (.agents/.github/.claude skills folders) or a skills directory"


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="skill_command", required=True, metavar="ACTION")
    install = sub.add_parser("install", help="copy (or link) the skill folder where agents look for skills",
                             description="DIR is a project root (the skill goes to DIR/.agents/skills/NAME, etc.)"
                                         " or, when its name is `skills`, a skills directory (DIR/NAME).")
    install.add_argument("--target", required=True, metavar="DIR", help="project root or skills directory")
    install.add_argument("--layout", choices=["agents", "github", "claude", "all"], action="append",
                         help="skills folder(s) of a project root: .agents/skills (default), .github/skills,"
                              " .claude/skills, or all three; repeatable")
    install.add_argument("--link", action="store_true", help="symlink to the repository instead of copying")
    install.add_argument("--force", action="store_true", help="replace an installed skill of the same name")
    install.add_argument("--source", metavar="DIR", help="the skill to install (default: this repository)")


def main(args: argparse.Namespace) -> int:
    from ditgate.skill.install import LAYOUTS, install_skill

    chosen = args.layout or ["agents"]
    layouts = tuple(LAYOUTS) if "all" in chosen else tuple(chosen)
    result = install_skill(args.target, source=args.source, layouts=layouts, link=args.link, force=args.force)
    how = "linked" if result.linked else f"copied ({', '.join(result.parts)})"
    for path in result.paths:
        print(f"{result.name}: {how} -> {path}")
    return 0
