"""_graph's bookkeeping for the passes: Splices gives what splice() one after another gives,
and the views shared between passes are those a fresh build gives."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized.passes._graph import Splices, splice


def _nodes(count, prefix="n"):
    return [helper.make_node("Relu", [f"{prefix}{k}_in"], [f"{prefix}{k}"]) for k in range(count)]


# one replacement: which nodes it replaces (positions into the list of every node made so
# far, so a later one may take nodes an earlier one made, or ones already gone) and how many
# new nodes it puts in their place
_replacement = st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=4),
                         st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 30), replacements=st.lists(_replacement, max_size=12))
def test_splices_give_what_splice_one_after_another_gives(count, replacements):
    original = _nodes(count)
    made = list(original)  # every node either side may name
    expected, spliced = list(original), Splices(original)
    for r, (picks, new_count) in enumerate(replacements):
        old = [made[p % len(made)] for p in picks]
        new = _nodes(new_count, prefix=f"r{r}_")
        made.extend(new)
        try:
            expected = splice(expected, old, new)
        except ValueError:
            with pytest.raises(ValueError, match="none of the nodes"):
                spliced.replace(old, new)
            continue
        spliced.replace(old, new)
    assert [id(n) for n in spliced.nodes()] == [id(n) for n in expected]


def test_splices_place_each_replacement_where_the_last_of_its_nodes_stood():
    a, b, c, d, e = _nodes(5)
    x, y = _nodes(2, prefix="new")
    spliced = Splices([a, b, c, d, e])
    spliced.replace([d, b], [x])
    spliced.replace([a], [y])
    assert spliced.nodes() == [y, c, x, e]


def test_splices_without_a_replacement_give_the_list_itself():
    nodes = _nodes(3)
    assert Splices(nodes).nodes() == nodes
