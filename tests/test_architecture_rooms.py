"""ARCHITECTURE.md's list of what each room imports is the one the code has.

The list sits in ARCHITECTURE.md under "Read as a list", one room a line (``tracking ->
capture, errors, formats, fx``; a ``#`` starts a note). The rooms are the folders of
``unitscale/`` and its two top-level modules (``errors``, ``formats``); an import counts
wherever it sits in a module (at the top, inside a function), except under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import re

from tests.test_architecture import ROOT, all_imports, modules

LIST = re.compile(r"Read as a list.*?\n```\n(.*?)```", re.S)
LAYERS = re.compile(r"## What imports what.*?\n```\n(.*?)```", re.S)
# (room, room it imports from a layer that is not below its own): each written on the page.
UPWARD_ALLOWED = {("scaling", "optim")}  # transfer.py's default optimiser, a local import


def room(module: str) -> str | None:
    """``tracking`` for ``unitscale.tracking.report``; None for the top-level face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def rooms_imported() -> dict[str, set[str]]:
    """Room -> the other rooms its modules import, read from the code."""
    found: dict[str, set[str]] = {name: set() for module in modules() if (name := room(module))}
    for imp in all_imports():
        source, target = room(imp.importer), room(imp.module)
        if source is None or imp.type_only:
            continue
        if target is not None and target != source:
            found[source].add(target)
    return found


def rooms_written() -> dict[str, set[str]]:
    """Room -> the rooms ARCHITECTURE.md says it imports."""
    match = LIST.search((ROOT / "ARCHITECTURE.md").read_text())
    assert match, "ARCHITECTURE.md has no 'Read as a list' block"
    written: dict[str, set[str]] = {}
    for line in match.group(1).splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        left, _, right = line.partition("->")
        targets = {name.strip() for name in right.split(",") if name.strip() and name.strip() != "nothing"}
        for name in left.split(","):
            written[name.strip()] = targets
    return written


def test_architecture_lists_what_each_room_imports() -> None:
    code, page = rooms_imported(), rooms_written()
    assert set(page) == set(code), (
        f"rooms missing from the list: {set(code) - set(page)}, extra: {set(page) - set(code)}"
    )
    wrong = {
        name: f"the code imports {sorted(code[name])}, the page says {sorted(page[name])}"
        for name in code
        if code[name] != page[name]
    }
    assert not wrong, wrong


def layers_written() -> dict[str, int]:
    """Room -> its layer in ARCHITECTURE.md's table under "What imports what"."""
    match = LAYERS.search((ROOT / "ARCHITECTURE.md").read_text())
    assert match, "ARCHITECTURE.md has no layer table under 'What imports what'"
    header, *rows = match.group(1).splitlines()
    end = header.index("imports from below")
    layers = {}
    for row in rows:
        number, _, rooms = row[:end].strip().partition(" ")
        for name in re.findall(r"(\w+)(?:/|\.py)", rooms):
            if name != "__init__":
                layers[name] = int(number)
    return layers


def test_a_room_imports_only_rooms_below_it() -> None:
    layers, code = layers_written(), rooms_imported()
    assert set(layers) == set(code), f"rooms missing from the layer table: {set(code) - set(layers)}"
    up = {(room, target) for room, targets in code.items() for target in targets if layers[target] >= layers[room]}
    assert up <= UPWARD_ALLOWED, f"imports of a room on the same layer or above: {sorted(up - UPWARD_ALLOWED)}"
    assert UPWARD_ALLOWED <= up, f"fixed, so remove from UPWARD_ALLOWED: {sorted(UPWARD_ALLOWED - up)}"
