"""``unitscale.stages`` in rooms, read from the code (``unitscale/stages/README.md`` draws them).

From the bottom up: ``schedules`` (the schedule vocabulary), ``partitioner``, ``planner``,
``runtime``. A module imports only its own room and the rooms below it (type-only imports
count too), and each room's face lists at most about a dozen names, as does ``unitscale.stages``,
which binds no name beyond its ``__all__``: what it leaves out is imported from its room's face.
"""

from __future__ import annotations

import importlib
import types

from tests.test_architecture import all_imports

FLOORS = ("schedules", "partitioner", "planner", "runtime")


def floor(module: str) -> int | None:
    """The floor of ``unitscale.stages.<room>...`` (0 = schedules), None outside the rooms."""
    parts = module.split(".")
    if parts[:2] != ["unitscale", "stages"] or len(parts) < 3 or parts[2] not in FLOORS:
        return None
    return FLOORS.index(parts[2])


def stage_arrows() -> set[tuple[str, str]]:
    """(room, room it imports) for every import between two rooms."""
    found = set()
    for imp in all_imports():
        source, target = floor(imp.importer), floor(imp.module)
        if source is not None and target is not None and source != target:
            found.add((FLOORS[source], FLOORS[target]))
    return found


def test_the_stage_rooms_import_only_downward() -> None:
    arrows = stage_arrows()
    upward = sorted((a, b) for a, b in arrows if FLOORS.index(a) < FLOORS.index(b))
    assert not upward, f"a room imports a room above it (move what both need down): {upward}"
    # the arrows the README draws, so the check above reads real imports
    assert arrows == {
        ("partitioner", "schedules"),
        ("planner", "schedules"),
        ("planner", "partitioner"),
        ("runtime", "schedules"),
        ("runtime", "partitioner"),
        ("runtime", "planner"),
    }


def test_each_stage_room_has_a_small_face_the_stages_face_draws_from() -> None:
    stages = importlib.import_module("unitscale.stages")
    faces = [importlib.import_module(f"unitscale.stages.{room}") for room in FLOORS]
    assert all(len(face.__all__) <= 12 for face in faces), [len(face.__all__) for face in faces]
    for name in stages.__all__:
        homes = [face for face in faces if getattr(face, name, None) is getattr(stages, name)]
        assert homes, f"unitscale.stages.{name} comes from no room's face"


def test_the_stages_face_lists_a_dozen_names_and_hides_no_other() -> None:
    stages = importlib.import_module("unitscale.stages")
    assert len(stages.__all__) <= 12, stages.__all__
    bound = {name for name, value in vars(stages).items() if not isinstance(value, types.ModuleType)}
    hidden = sorted(name for name in bound - set(stages.__all__) if not name.startswith("_"))
    assert not hidden, f"unitscale.stages binds names its __all__ does not list (import them from a room): {hidden}"
