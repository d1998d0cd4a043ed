"""README.md is a front door whose every command and link works.

It stays short (at most 250 lines; the long parts live in docs/ and the generated results/README.md), and
everything it tells a reader to run or open resolves in this checkout:

- relative links (README.md, results/README.md, docs/*.md) name files that exist, and an ``#anchor``
  names a heading of the linked page;
- repository paths in backticks (``examples/train_fsdp.py``, ``tests/...``) exist;
- ``make X`` names a target of the Makefile; ``python -m X`` a module that can be found;
- ``experiment=``/``strategy=``/``fault=``/... choices name a file in conf/<group>/;
- a script's ``--flags`` in a command appear in that script; ``-m MARKER`` is a declared pytest marker.

Pure text checks (no process is started), so it costs well under a second.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250
TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
CONF_GROUPS = {p.name for p in (ROOT / "conf").iterdir() if p.is_dir()}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", md.read_text(), re.M)}


def _pages() -> list[Path]:
    return [README, ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(text: str) -> list[str]:
    """Shell commands the page tells a reader to run: fenced bash lines and inline code spans."""
    cmds, prose, fence = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence is None:
            prose.append(line)
        elif fence in ("", "bash", "sh"):
            line = line.split("  #")[0].strip()
            if line and not line.startswith(("#", "$", "...", "error:")):
                cmds.append(line)
    cmds += CODE.findall("\n".join(prose))
    return cmds


def _words(cmd: str) -> list[str]:
    try:
        return shlex.split(cmd.replace("\\\n", " "))
    except ValueError:  # an inline span that is not shell (e.g. a Python expression with a quote)
        return cmd.split()


def test_readme_is_a_short_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.md has {len(lines)} lines, the limit is {MAX_LINES}: move the detail into docs/ and link it"
    )


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)


def test_repository_paths_in_the_readme_exist():
    missing = []
    for span in CODE.findall(README.read_text()):
        for word in _words(span):
            word = word.rstrip(".,:;)")
            if re.fullmatch(r"[\w.\-/]+", word) and "/" in word and word.split("/")[0] in TOP_LEVEL:
                if not (ROOT / word).exists():
                    missing.append(word)
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_make_targets_in_the_readme_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.M))
    wanted = set()
    for cmd in _commands(README.read_text()):
        words = _words(cmd)
        for i, w in enumerate(words[:-1]):
            if w == "make" and not words[i + 1].startswith("-") and "=" not in words[i + 1]:
                wanted.add(words[i + 1])
    assert wanted, "found no `make` command in README.md: the parser is broken"
    assert wanted <= targets, f"README.md runs make targets the Makefile lacks: {sorted(wanted - targets)}"


def test_python_modules_in_the_readme_exist():
    wanted = set()
    for cmd in _commands(README.read_text()):
        words = _words(cmd)
        for i, w in enumerate(words[:-1]):
            if w == "-m" and words[i - 1].endswith("python") and "<" not in words[i + 1]:
                wanted.add(words[i + 1])
    assert {"harness", "experiments.readme_results"} <= wanted, f"the parser found only {sorted(wanted)}"
    missing = [m for m in sorted(wanted) if importlib.util.find_spec(m) is None]
    assert not missing, f"README.md runs modules that do not exist: {missing}"


def test_config_choices_in_the_readme_exist():
    checked, missing = 0, []
    for cmd in _commands(README.read_text()):
        for word in _words(cmd):
            group, eq, value = word.partition("=")
            if eq and group in CONF_GROUPS and re.fullmatch(r"[\w,]+", value):
                for choice in value.split(","):
                    checked += 1
                    if not (ROOT / "conf" / group / f"{choice}.yaml").exists():
                        missing.append(f"{group}={choice}")
    assert checked >= 5, f"found only {checked} config choices in README.md: the parser is broken"
    assert not missing, f"README.md names config choices with no file in conf/: {missing}"


def test_script_flags_and_pytest_markers_in_the_readme_exist():
    markers = {
        m.split(":")[0]
        for m in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    }
    problems, scripts = [], 0
    for cmd in _commands(README.read_text()):
        words = _words(cmd)
        if "pytest" in words:
            problems += [
                f"marker {w}" for p, w in zip(words, words[1:]) if p == "-m" and w not in markers and "not " not in w
            ]
        script = next((w for w in words if w.endswith(".py") and (ROOT / w).is_file()), None)
        if script is None:
            continue
        scripts += 1
        source = (ROOT / script).read_text()
        after = words[words.index(script) + 1 :]
        problems += [f"{script} {w}" for w in after if w.startswith("--") and f'"{w.split("=")[0]}"' not in source]
    assert scripts, "found no script command in README.md: the parser is broken"
    assert not problems, f"README.md passes options that do not exist: {problems}"


def test_readme_quotes_no_commit_shas():
    """A sha in the front door is a changelog entry; provenance belongs in results/ and docs/."""
    shas = re.findall(r"`([0-9a-f]{7,40})`|\bat ([0-9a-f]{7,40})\b|\bcommit ([0-9a-f]{7,40})\b", README.read_text())
    assert not shas, f"README.md quotes commit shas: {shas}"


def test_the_guided_tour_names_files_that_exist():
    text = README.read_text()
    start = text.index("## A guided tour")
    tour = text[start : text.index("\n## ", start + 1)]
    targets = LINK.findall(tour)
    assert 6 <= len(targets) <= 10, f"the tour should name 6-8 files to read first; it names {len(targets)}"
    assert all((ROOT / t).is_file() for t in targets), [t for t in targets if not (ROOT / t).is_file()]
