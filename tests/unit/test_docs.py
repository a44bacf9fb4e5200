"""The docs pages' "not done" lists name only things that are not done (issue 16).

Convention (docs/architecture.md, "What is not done"): a section whose heading starts with "Not done",
"Not there", "Not supported" or "Limitations" is a not-done list. Each of its items (a top-level bullet, or
a paragraph when the section has no bullets) carries one or more probes, HTML comments that the rendered
page does not show:

    <!-- absent: KIND ARGUMENTS -->

and every probe must find its thing absent from the code. When someone builds the thing, its probe finds
it and this test fails until the page stops calling it "not done". Kinds:

- `route METHOD /api/PATH`: no such route in the management API's route table;
- `config KEY`: no such config-file key;
- `ctl COMMAND` / `queues COMMAND`: no such hutchctl / hutch-queues command;
- `queue-arg TYPE x-NAME`: queues of that type take no such x-argument; `queue-type NAME`: no such queue
  type can be declared; `policy KEY`: no such policy key;
- `symbol MODULE[:ATTR]`: the module (or the attribute of an importable module) does not exist; the
  module's parent package must import, so a typo cannot make a probe pass;
- `text REGEX in GLOB [GLOB ...]`: the regular expression occurs in none of the files (each glob, relative
  to the repository, must match at least one file).

The probe evaluator is itself tested on a page that calls something done "not done".
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOT_DONE_HEADING = re.compile(r"^(#+)\s+(Not done|Not there|Not supported|Limitations)\b", re.I)
HEADING = re.compile(r"^(#+)\s")
PROBE = re.compile(r"<!--\s*absent:\s*(.*?)\s*-->", re.S)


@dataclass(frozen=True)
class Item:
    page: str
    heading: str
    text: str

    @property
    def probes(self) -> list[str]:
        return [" ".join(p.split()) for p in PROBE.findall(self.text)]


def not_done_items(page: str, text: str) -> list[Item]:
    """The items of every not-done section of a page: top-level bullets, else paragraphs."""
    items: list[Item] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = NOT_DONE_HEADING.match(lines[i])
        if not m:
            i += 1
            continue
        level, heading = len(m.group(1)), lines[i].lstrip("# ").strip()
        body: list[str] = []
        i += 1
        while i < len(lines):
            h = HEADING.match(lines[i])
            if h and len(h.group(1)) <= level:
                break
            body.append(lines[i])
            i += 1
        bullets = [n for n, line in enumerate(body) if line.startswith(("- ", "* "))]
        if bullets:
            ends = [*bullets[1:], len(body)]
            chunks = ["\n".join(body[a:b]) for a, b in zip(bullets, ends, strict=True)]
        else:
            chunks = [c for c in "\n".join(body).split("\n\n") if c.strip()]
        items += [Item(page, heading, c.strip()) for c in chunks]
    return items


class ProbeError(ValueError):
    """A probe that cannot be evaluated (unknown kind, malformed, a path that matches nothing)."""


def _routes() -> set[tuple[str, str]]:
    from hutch.mgmt import http  # noqa: F401  (registers every route module)
    from hutch.mgmt.calls import ROUTES

    return {(r.method, r.path) for r in ROUTES}


def _text_present(arg: str) -> bool:
    pattern, sep, globs = arg.rpartition(" in ")
    if not sep or not pattern.strip() or not globs.split():
        raise ProbeError(f"expected 'text REGEX in GLOB...', got {arg!r}")
    regex = re.compile(pattern.strip())
    for glob in globs.split():
        files = [p for p in ROOT.glob(glob) if p.is_file()]
        if not files:
            raise ProbeError(f"{glob!r} matches no file")
        if any(regex.search(p.read_text(errors="replace")) for p in files):
            return True
    return False


def _symbol_present(arg: str) -> bool:
    module, _, attr = arg.partition(":")
    parent = module.rpartition(".")[0]
    if parent:
        importlib.import_module(parent)  # a probe on a misspelt package would pass for nothing
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        if attr:
            raise ProbeError(f"module {module!r} does not exist") from None
        return False
    return not attr or hasattr(mod, attr)


def probe_present(probe: str) -> bool:
    """Does the thing this probe names exist in the code?"""
    kind, _, arg = probe.partition(" ")
    if not arg:
        raise ProbeError(f"probe {probe!r} has no argument")
    if kind == "route":
        method, _, path = arg.partition(" ")
        if method not in ("GET", "PUT", "POST", "DELETE") or not path.startswith("/api/"):
            raise ProbeError(f"expected 'route METHOD /api/PATH', got {arg!r}")
        return (method, path) in _routes()
    if kind == "config":
        from hutch.config import _FILE_KEYS

        return arg in _FILE_KEYS
    if kind == "ctl":
        from hutch.cli.ctl import COMMANDS

        return arg in COMMANDS
    if kind == "queues":
        from hutch.cli.queues import COMMANDS as QUEUE_COMMANDS

        return arg in QUEUE_COMMANDS
    if kind == "queue-arg":
        from hutch.core.arguments import QUEUE_TYPE_ARGUMENTS

        qtype, _, name = arg.partition(" ")
        if qtype not in QUEUE_TYPE_ARGUMENTS or not name.startswith("x-"):
            raise ProbeError(f"expected 'queue-arg TYPE x-NAME', got {arg!r}")
        return name in QUEUE_TYPE_ARGUMENTS[qtype]
    if kind == "queue-type":
        from hutch.core.arguments import SUPPORTED_QUEUE_TYPES

        return arg in SUPPORTED_QUEUE_TYPES
    if kind == "policy":
        from hutch.core.policy import POLICY_KEYS

        return arg in POLICY_KEYS
    if kind == "symbol":
        return _symbol_present(arg)
    if kind == "text":
        return _text_present(arg)
    raise ProbeError(f"unknown probe kind {kind!r} in {probe!r}")


def check_page(page: str, text: str) -> list[str]:
    """Every problem with a page's not-done lists, one line each (nothing: the page is right)."""
    problems: list[str] = []
    for item in not_done_items(page, text):
        first = item.text.splitlines()[0][:80]
        if not item.probes:
            problems.append(f"{page} / {item.heading}: item without a probe: {first!r}")
        for probe in item.probes:
            try:
                if probe_present(probe):
                    problems.append(f"{page} / {item.heading}: {first!r} is listed as not done, but "
                                    f"'{probe}' exists")
            except (ProbeError, re.error, ImportError) as exc:
                problems.append(f"{page} / {item.heading}: bad probe '{probe}': {exc}")
    return problems


PAGES = sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_not_done_lists_name_only_what_is_not_done(path: Path) -> None:
    assert check_page(path.name, path.read_text()) == []


def test_the_pages_have_not_done_lists_to_check() -> None:
    items = [i for p in PAGES for i in not_done_items(p.name, p.read_text())]
    assert len(items) >= 10 and all(i.probes for i in items)


# -- the checker itself ---------------------------------------------------------------------------------

STALE = """\
# A page

Text.

## Not done yet

- Vhost limits. <!-- absent: route GET /api/vhost-limits -->
- Clustering cannot be turned off. <!-- absent: config cluster.enabled -->
- A hutchctl command for limits <!-- absent: ctl set_vhost_limits -->
  on two lines.
- Something truly missing. <!-- absent: route GET /api/feature-flags -->
- Limits as a core module. <!-- absent: symbol hutch.core.limits -->
- Streams. <!-- absent: text "x-stream-offset" in src/hutch/core/arguments.py -->
- No probe at all.

## Next section

- Not an item of the list. <!-- absent: config heartbeat -->

### Not there

A paragraph about the web UI. <!-- absent: symbol hutch.mgmt.nosuchmodule -->
"""


def test_the_checker_catches_a_stale_list() -> None:
    problems = check_page("stale.md", STALE)
    found = [m.group(1) for p in problems if (m := re.search(r"but '(.*)' exists$", p))]
    assert found == ["route GET /api/vhost-limits", "config cluster.enabled", "ctl set_vhost_limits",
                     "symbol hutch.core.limits", 'text "x-stream-offset" in src/hutch/core/arguments.py']
    assert [p for p in problems if "exists" not in p] == ["stale.md / Not done yet: item without a probe: "
                                                          "'- No probe at all.'"]


def test_bad_probes_are_problems_not_passes() -> None:
    page = ("## Not done\n\n- a <!-- absent: text foo in no/such/file.py -->\n"
            "- b <!-- absent: symbol hutch.nosuchpackage.x -->\n- c <!-- absent: frobnicate x -->\n"
            "- d <!-- absent: symbol hutch.config:NoSuchThing -->\n")
    problems = check_page("bad.md", page)
    assert len(problems) == 3, problems  # d is a fine probe: hutch.config has no NoSuchThing
    assert all("bad probe" in p for p in problems)
