"""Under ``-j``, the notebooks are dealt out over the chunks Sphinx reads (``docs/_ext/spread_notebooks.py``).

The oracle is Sphinx's own ``make_chunks``, applied to the order the extension gives: the
chunks a parallel build reads come out with the sizes they had, and the notebooks shared out.
"""

import math
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from sphinx.util.parallel import make_chunks

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from spread_notebooks import spread  # noqa: E402


def test_two_chunks_of_five_take_the_three_notebooks_in_turn():
    names = list("abcdefghij")  # two chunks of five: a-e, f-j, with all three notebooks in the second
    order = spread(names, lambda d: d in "hij", nproc=2)
    assert make_chunks(order, 2) == [list("hjabc"), list("idefg")]


def test_the_sites_own_pages_no_longer_put_the_tutorials_in_one_chunk():
    """The case measured in a cold build: 253 pages, the tutorials and three pages executed, two processes."""
    notebooks = [p.relative_to(ROOT).with_suffix("").as_posix() for p in sorted(ROOT.glob("tutorials/[0-9]*.md"))]
    names = sorted([*(f"docs/generated/page{i:03d}" for i in range(239 - len(notebooks))), *notebooks])
    names = sorted([*names, "docs/against-the-reference", "docs/benchmarks", "docs/planner"])
    executes = set(notebooks) | {"docs/against-the-reference", "docs/benchmarks", "docs/planner"}

    def per_chunk(order):
        return [sum(d in executes for d in chunk) for chunk in make_chunks(order, 2)]

    assert max(per_chunk(names)) >= 8  # sorted by name, as Sphinx reads them
    fewest = math.ceil(len(executes) / len(make_chunks(names, 2)))  # the notebooks dealt out evenly
    assert max(per_chunk(spread(names, executes.__contains__, nproc=2))) == fewest


@given(
    st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)))),
    st.integers(1, 8),
)
def test_chunks_keep_their_sizes_and_share_the_notebooks(case, nproc):
    n, chosen = case
    names = [f"page{i:03d}" for i in range(n)]
    executes = {names[i] for i in chosen}.__contains__
    before, order = make_chunks(names, nproc), spread(names, executes, nproc)
    after = make_chunks(order, nproc)
    assert sorted(order) == names
    assert [len(c) for c in after] == [len(c) for c in before]
    assert [d for d in order if not executes(d)] == [d for d in names if not executes(d)]
    if len(after) > 1 and all(math.ceil(len(chosen) / len(after)) <= len(c) for c in after):
        # no chunk fills up: the i-th notebook is dealt to chunk i mod the number of chunks
        notebooks = [d for d in names if executes(d)]
        assert [[d for d in chunk if executes(d)] for chunk in after] == [
            notebooks[k :: len(after)] for k in range(len(after))
        ]
