"""`ditgate skill install`: the installed folder is complete, passes the linter and the specification's reference
validator (`agentskills validate`), and is never left half-written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skill_fixture import NAME, edit, write_skill

from ditgate.skill import install_skill, lint
from ditgate.skill.install import SkillExistsError, SkillInstallError


def agentskills(folder: Path) -> subprocess.CompletedProcess:
    """The Agent Skills reference validator (PyPI skills-ref), run as its own process."""
    exe = shutil.which("agentskills") or str(Path(sys.executable).with_name("agentskills"))
    return subprocess.run([exe, "validate", str(folder)], capture_output=True, text=True, timeout=120)


@pytest.fixture()
def source(tmp_path):
    return write_skill(tmp_path / "repo", name="checkout")


def test_install_copies_the_skill_into_a_project(source, tmp_path, run_cli):
    project = tmp_path / "project"
    code, out, _ = run_cli("skill", "install", "--target", project, "--source", source)
    dest = project / ".agents" / "skills" / NAME
    assert code == 0 and str(dest) in out
    assert dest.is_dir() and not dest.is_symlink()
    assert sorted(p.name for p in dest.iterdir()) == ["SKILL.md", "checklists", "notebooks", "references"]
    assert (dest / "checklists" / "gates.json").read_bytes() == (source / "checklists" / "gates.json").read_bytes()
    assert sorted(os.listdir(dest.parent)) == [NAME]             # no temporary folder left behind
    report = lint(dest)                                          # links still resolve, name equals the folder
    assert report.findings == [], [f.format() for f in report.findings]
    result = agentskills(dest)
    assert result.returncode == 0, result.stdout + result.stderr


def test_reference_validator_rejects_a_bad_frontmatter_key(source, tmp_path):
    dest = install_skill(tmp_path / "project", source=source).paths[0]
    edit(dest / "SKILL.md", "license: Apache-2.0", "license: Apache-2.0\nuser-invocable: true")
    result = agentskills(dest)
    assert result.returncode == 1 and "user-invocable" in result.stdout + result.stderr
    assert [f.rule for f in lint(dest).errors] == ["frontmatter"]


def test_every_layout(source, tmp_path):
    project = tmp_path / "project"
    result = install_skill(project, source=source, layouts=("agents", "github", "claude"))
    assert [p.relative_to(project).as_posix() for p in result.paths] == [
        f".agents/skills/{NAME}", f".github/skills/{NAME}", f".claude/skills/{NAME}"]
    assert all((p / "SKILL.md").is_file() for p in result.paths)


def test_layout_all_from_the_cli(source, tmp_path, run_cli):
    code, out, _ = run_cli("skill", "install", "--target", tmp_path / "p", "--source", source, "--layout", "all")
    assert code == 0 and out.count("copied") == 3


def test_a_skills_directory_target(source, tmp_path):
    skills = tmp_path / "home" / "skills"
    [dest] = install_skill(skills, source=source).paths
    assert dest == skills.absolute() / NAME and (dest / "SKILL.md").is_file()


def test_refuses_to_overwrite_without_force(source, tmp_path, run_cli):
    project = tmp_path / "project"
    dest = install_skill(project, source=source).paths[0]
    (dest / "local-note.txt").write_text("mine")
    with pytest.raises(SkillExistsError):
        install_skill(project, source=source)
    code, _, err = run_cli("skill", "install", "--target", project, "--source", source)
    assert code == 2 and "--force" in err and (dest / "local-note.txt").exists()
    install_skill(project, source=source, force=True)
    assert not (dest / "local-note.txt").exists() and (dest / "SKILL.md").is_file()
    assert sorted(os.listdir(dest.parent)) == [NAME]


def test_link_installs_a_symlink_to_the_repository(source, tmp_path):
    project = tmp_path / "project"
    [dest] = install_skill(project, source=source, link=True).paths
    assert dest.is_symlink() and dest.resolve() == source.resolve()
    assert agentskills(dest).returncode == 0
    [again] = install_skill(project, source=source, link=True, force=True).paths   # relinking works
    assert again.is_symlink()
    install_skill(project, source=source, force=True)                             # a copy replaces the link
    assert not dest.is_symlink() and source.exists() and (dest / "SKILL.md").is_file()


def test_failed_copy_leaves_nothing_behind(source, tmp_path):
    (source / "references" / "dangling.md").symlink_to(tmp_path / "nowhere.md")
    project = tmp_path / "project"
    with pytest.raises(SkillInstallError, match="dangling.md"):  # refused before anything is copied
        install_skill(project, source=source)
    assert not (project / ".agents" / "skills").exists() or os.listdir(project / ".agents" / "skills") == []


def test_source_without_a_skill(tmp_path, run_cli):
    with pytest.raises(SkillInstallError, match="holds no SKILL.md"):
        install_skill(tmp_path / "project", source=tmp_path)
    code, _, err = run_cli("skill", "install", "--target", tmp_path / "p", "--source", tmp_path)
    assert code == 2 and "holds no SKILL.md" in err


def test_source_with_an_invalid_name(source, tmp_path):
    edit(source / "SKILL.md", "name: cache-dit-model-integration", "name: Not A Name")
    with pytest.raises(SkillInstallError, match="valid `name`"):
        install_skill(tmp_path / "project", source=source)
