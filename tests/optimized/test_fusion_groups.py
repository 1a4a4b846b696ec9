"""The one grouping rule both providers fuse by (optimized/fusion_groups.py): hand-checked
graphs, and the laws every group obeys on random graphs."""
import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from optimized.fusion_groups import GroupGraph, chains, trees


def _graph(edges, n_inputs=2, keep=(), ineligible=()):
    """edges[i]: the values node i reads ('x0'.. graph inputs, 'v3': node 3's output)."""
    inputs = [list(e) for e in edges]
    outputs = [f"v{i}" for i in range(len(edges))]
    readers = Counter(v for e in inputs for v in e)
    eligible = [i not in ineligible for i in range(len(edges))]
    return GroupGraph(inputs, outputs, eligible, readers, set(keep))


def test_two_branches_into_one_node_are_one_tree_but_one_chain_and_a_single():
    g = _graph([["x0"], ["x1"], ["v1", "v0"], ["v2"]])  # v2 = f(g(x1), h(x0)); v3 = k(v2)
    assert trees(g) == [[0, 1, 2, 3]]
    assert chains(g) == [[0, 2, 3]]  # the forward walk takes the first producer; node 1 stays


def test_a_value_read_twice_or_kept_ends_the_group():
    g = _graph([["x0"], ["v0"], ["v0", "v1"], ["v2"]])  # v0 read by nodes 1 and 2
    assert trees(g) == [[1, 2, 3]]
    assert chains(g) == [[1, 2, 3]]
    kept = _graph([["x0"], ["v0"], ["v1"]], keep={"v0"})
    assert trees(kept) == [[1, 2]] and chains(kept) == [[1, 2]]


def test_an_ineligible_node_splits_the_groups():
    g = _graph([["x0"], ["v0"], ["v1"], ["v2"], ["v3"]], ineligible={2})
    assert trees(g) == [[0, 1], [3, 4]]
    assert chains(g) == [[0, 1], [3, 4]]


def test_a_node_reading_the_same_value_twice_is_not_chained_to_it():
    g = _graph([["x0"], ["v0", "v0"]])
    assert chains(g) == [] and trees(g) == []


@st.composite
def random_graphs(draw):
    n = draw(st.integers(1, 12))
    edges = []
    for i in range(n):
        pool = [f"x{k}" for k in range(2)] + [f"v{j}" for j in range(i)]
        edges.append(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2)))
    keep = draw(st.sets(st.sampled_from([f"v{i}" for i in range(n)]), max_size=2))
    ineligible = draw(st.sets(st.integers(0, n - 1), max_size=3))
    return _graph(edges, keep=keep, ineligible=ineligible)


@settings(max_examples=300, deadline=None)
@given(random_graphs())
def test_groups_hide_only_values_read_once_inside_them(g):
    for groups, linear in ((trees(g), False), (chains(g), True)):
        seen = [i for members in groups for i in members]
        assert len(seen) == len(set(seen)), "a node in two groups"
        for members in groups:
            assert len(members) >= 2 and all(g.eligible[i] for i in members)
            root = members[-1]
            for i in members:
                if i == root:
                    continue
                out = g.outputs[i]
                readers_inside = [j for j in members if out in g.inputs[j]]
                assert out not in g.keep and g.readers[out] == 1 and len(readers_inside) == 1
                assert readers_inside[0] > i
            if linear:  # a path: each member reads its predecessor
                for prev, nxt in itertools.pairwise(members):
                    assert g.outputs[prev] in g.inputs[nxt]
