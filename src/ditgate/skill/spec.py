"""Rules from the Agent Skills specification: SKILL.md's frontmatter and its size budget."""

from __future__ import annotations

import re
from collections.abc import Iterator

import yaml

from ditgate.skill.base import SKILL_FILE, Problem, Skill

NAME_MAX = 64
DESCRIPTION_MAX = 1024
COMPATIBILITY_MAX = 500
NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")     # [a-z0-9-], no leading, trailing or double hyphen
ALLOWED_KEYS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")

SKILL_MAX_LINES = 500
SKILL_MAX_TOKENS = 5000
REFERENCE_WARN_TOKENS = 10000
CHARS_PER_TOKEN = 4          # tokens are estimated as characters / 4


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def check_frontmatter(skill: Skill) -> Iterator[Problem]:
    doc = skill.skill_md
    if doc is None:
        yield Problem(SKILL_FILE, 1, "the skill has no SKILL.md")
        return
    front = doc.frontmatter
    if front is None:
        yield Problem(SKILL_FILE, 1, "SKILL.md must start with YAML frontmatter between two `---` lines")
        return
    if not front.closed:
        yield Problem(SKILL_FILE, 1, "the frontmatter is not closed by a `---` line")
        return
    try:
        node = yaml.compose(front.text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(front.text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = front.first_line + (mark.line if mark else 0)
        yield Problem(SKILL_FILE, line, f"the frontmatter is not valid YAML: {getattr(exc, 'problem', exc)}")
        return
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        yield Problem(SKILL_FILE, front.first_line, "the frontmatter must be a YAML mapping of keys to values")
        return

    def line_of(n: yaml.Node) -> int:
        return front.first_line + n.start_mark.line

    seen: set[str] = set()
    key_lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = str(key_node.value)
        key_lines[key] = line_of(key_node)
        if key in seen:
            yield Problem(SKILL_FILE, line_of(key_node), f"key `{key}` appears twice")
        seen.add(key)
        if key not in ALLOWED_KEYS:
            yield Problem(SKILL_FILE, line_of(key_node),
                          f"key `{key}` is not in the Agent Skills specification (allowed: {', '.join(ALLOWED_KEYS)});"
                          f" put it under `metadata`")
        if isinstance(value_node, (yaml.MappingNode, yaml.SequenceNode)) and value_node.flow_style:
            yield Problem(SKILL_FILE, line_of(value_node),
                          f"`{key}` uses YAML flow style ({{...}} or [...]), which strict YAML parsers such as the"
                          f" reference validator reject; write it in block style")

    def problem(key: str, message: str) -> Problem:
        return Problem(SKILL_FILE, key_lines.get(key, front.first_line), message)

    name = data.get("name")
    if "name" not in data:
        yield problem("name", "the frontmatter has no `name`")
    elif not isinstance(name, str):
        yield problem("name", "`name` must be a string")
    else:
        if len(name) > NAME_MAX:
            yield problem("name", f"`name` has {len(name)} characters; at most {NAME_MAX} are allowed")
        if not NAME_PATTERN.match(name):
            yield problem("name", f"`name` {name!r} must be lowercase letters, digits and single hyphens, not"
                                  f" starting or ending with a hyphen")
        if not skill.is_source_tree and skill.root.name != name:
            yield problem("name", f"`name` {name!r} must equal the skill's folder name {skill.root.name!r}")

    description = data.get("description")
    if "description" not in data:
        yield problem("description", "the frontmatter has no `description`")
    elif not isinstance(description, str) or not description.strip():
        yield problem("description", "`description` must be a non-empty string")
    else:
        if len(description) > DESCRIPTION_MAX:
            yield problem("description", f"`description` has {len(description)} characters; at most"
                                         f" {DESCRIPTION_MAX} are allowed")
        if "<" in description or ">" in description:
            yield Problem(SKILL_FILE, key_lines["description"], "`description` contains `<` or `>`, which some"
                          " platforms reject as markup", warning=True)

    if "compatibility" in data:
        value = data["compatibility"]
        if not isinstance(value, str) or not value.strip():
            yield problem("compatibility", "`compatibility` must be a non-empty string")
        elif len(value) > COMPATIBILITY_MAX:
            yield problem("compatibility", f"`compatibility` has {len(value)} characters; at most"
                                           f" {COMPATIBILITY_MAX} are allowed")
    for key in ("license", "allowed-tools"):
        if key in data and not isinstance(data[key], str):
            yield problem(key, f"`{key}` must be a string")
    if "metadata" in data:
        metadata = data["metadata"]
        if not isinstance(metadata, dict):
            yield problem("metadata", "`metadata` must be a mapping of strings to strings")
        else:
            for key, value in metadata.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    yield problem("metadata", f"`metadata` entry {key!r}: {value!r} must map a string to a string"
                                              f" (quote it)")


def check_budget(skill: Skill) -> Iterator[Problem]:
    doc = skill.skill_md
    if doc is not None:
        lines = len(doc.lines)
        if lines > SKILL_MAX_LINES:
            yield Problem(SKILL_FILE, SKILL_MAX_LINES + 1,
                          f"SKILL.md has {lines} lines; the budget is {SKILL_MAX_LINES}")
        tokens = estimate_tokens(doc.text)
        if tokens > SKILL_MAX_TOKENS:
            yield Problem(SKILL_FILE, 1, f"SKILL.md is about {tokens} tokens (estimated as characters / "
                                         f"{CHARS_PER_TOKEN}); the budget is {SKILL_MAX_TOKENS}")
    for ref in skill.references:
        tokens = estimate_tokens(ref.text)
        if tokens > REFERENCE_WARN_TOKENS:
            yield Problem(ref.rel, 1, f"about {tokens} tokens (estimated as characters / {CHARS_PER_TOKEN});"
                                      f" consider splitting it below {REFERENCE_WARN_TOKENS}", warning=True)
