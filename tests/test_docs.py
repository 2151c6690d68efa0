"""The README is the door and docs/ the site (issue 43), checked without building the site
(`make docs` builds it with --strict, which fails on a broken link, page or anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import trak_dist

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]


def nav_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    items = nav.values() if isinstance(nav, dict) else nav
    return set().union(*(nav_pages(item) for item in items))


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert nav_pages(config["nav"]) == on_disk


def test_the_api_page_documents_the_public_api():
    page = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: trak_dist\.(\w+)$", page, flags=re.M))
    assert documented == set(trak_dist.__all__) - {"__version__"}


def test_no_link_leaves_the_repository():
    """Relative links resolve inside the checkout (the README's and CONTRIBUTING's to files,
    the docs' to each other, which `make docs` checks too)."""
    for md in [*MARKDOWN, *(ROOT / "docs").glob("*.md")]:
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (md.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT), f"{md.name} links outside the repository: {target}"
            assert path.exists(), f"{md.name} links to a missing file: {target}"
