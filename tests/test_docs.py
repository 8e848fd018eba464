"""The README and the pages under docs/: short enough to read, every link and anchor resolves, every
code block is closed, and every ``otel-rl`` command the README names exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 250

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold one level of brackets
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...
_COMMAND = re.compile(r"(?:^|[\s;&|(`$])otel-rl\s+([a-z][a-z-]*)(?:\s+([a-z][a-z-]*))?")


def _doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _split(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]], list[str]]:
    """(prose lines, code-block lines, problems with fences), lines numbered from 1."""
    prose: list[tuple[int, str]] = []
    code: list[tuple[int, str]] = []
    problems: list[str] = []
    open_fence: tuple[int, str] | None = None  # (line number, fence)
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if open_fence is None:
            if m:
                open_fence = (lineno, m.group(1))
            else:
                prose.append((lineno, line))
            continue
        fence = open_fence[1]
        if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            open_fence = None
        else:
            code.append((lineno, line))
    if open_fence is not None:
        problems.append(f"the code block opened at line {open_fence[0]} ({open_fence[1]}) is never closed")
    return prose, code, problems


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    prose, _, _ = _split(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for _, line in prose:
        m = _HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    for name in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")):
        anchors.add(name)
    return anchors


def _links(path: Path) -> list[tuple[int, str]]:
    prose, _, _ = _split(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    for lineno, line in prose:
        line = _INLINE_CODE.sub("", line)
        found += [(lineno, target) for target in _LINK.findall(line)]
    return found


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into a page under docs/"


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_every_code_block_is_closed(path: Path) -> None:
    _, _, problems = _split(path.read_text(encoding="utf-8"))
    assert not problems, f"{_rel(path)}: " + "; ".join(problems)


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    broken = []
    for lineno, target in _links(path):
        if _EXTERNAL.match(target):
            continue
        where, _, anchor = target.partition("#")
        dest = (path.parent / unquote(where)).resolve() if where else path
        if not dest.exists():
            broken.append(f"{_rel(path)}:{lineno}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and unquote(anchor).lower() not in _anchors(dest):
            broken.append(f"{_rel(path)}:{lineno}: {target} (no heading #{anchor} in {_rel(dest)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _subcommands() -> dict[str, set[str]]:
    """Each ``otel-rl`` subcommand and the subcommands it has (empty when it has none)."""
    from otel_rl.cli import build_parser

    def children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        out: dict[str, argparse.ArgumentParser] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.update(action.choices)
        return out

    return {name: set(children(sub)) for name, sub in children(build_parser()).items()}


def _readme_commands() -> list[tuple[int, str, str | None]]:
    """Every ``otel-rl <sub> [<subsub>]`` in the README's code (inline spans and code blocks)."""
    prose, code, _ = _split(README.read_text(encoding="utf-8"))
    pieces = [(n, line) for n, line in code]
    for n, line in prose:
        pieces += [(n, span) for _, span in _INLINE_CODE.findall(line)]
    return [(n, m.group(1), m.group(2)) for n, text in pieces for m in _COMMAND.finditer(text)]


def test_the_readme_names_only_real_otel_rl_commands() -> None:
    commands = _subcommands()
    mentioned = _readme_commands()
    assert mentioned, "the README names no otel-rl command at all"
    wrong = []
    for lineno, sub, subsub in mentioned:
        if sub not in commands:
            wrong.append(f"README.md:{lineno}: otel-rl {sub} (commands: {', '.join(sorted(commands))})")
        elif commands[sub] and subsub is not None and subsub not in commands[sub]:
            wrong.append(f"README.md:{lineno}: otel-rl {sub} {subsub} (its subcommands: {', '.join(sorted(commands[sub]))})")
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    # Guards the guards: GitHub's slugs, an unclosed fence, links inside code ignored.
    assert _slug("Analyze: the report") == "analyze-the-report"
    assert _slug("Feed experiment trackers from the collector (the tracker bridge)") == (
        "feed-experiment-trackers-from-the-collector-the-tracker-bridge"
    )
    assert _slug("`otel-rl analyze`: example reports") == "otel-rl-analyze-example-reports"
    assert _slug("[verl-opd-collapse/](verl-opd-collapse/report.md): a run") == "verl-opd-collapse-a-run"
    _, _, problems = _split("text\n```text\n### Headline\n")
    assert problems
    _, code, problems = _split("````md\n```\n````\n")
    assert not problems and code == [(2, "```")]
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nsee [a](b.md) `[c](d.md)`\n\n```\n[e](f.md)\n```\n", encoding="utf-8")
    assert [t for _, t in _links(page)] == ["b.md"]
    assert _COMMAND.search("OTEL_RL_EXPORTERS=otlp otel-rl demo --steps 4").group(1) == "demo"  # type: ignore[union-attr]
    assert not _COMMAND.search("[otel-rl] step 20 | 0.38s")
