"""Property tests: random graphs, weight schemes, shapes, ranks and iteration counts."""

import networkx as nx
import numpy as np
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import topologies
from gossip_powersgd import LocalCluster, PowerGossip

SCHEMES = ["metropolis", "max_degree", "best_constant"]


@st.composite
def connected_graphs(draw, max_nodes=12):
    n = draw(st.integers(2, max_nodes))
    seed = draw(st.integers(0, 2**31 - 1))
    p = draw(st.floats(0.1, 0.9))
    graph = nx.gnp_random_graph(n, p, seed=seed)
    # join the components with one edge each, so that every draw is connected
    components = [sorted(c) for c in nx.connected_components(graph)]
    for a, b in zip(components, components[1:]):
        graph.add_edge(a[0], b[0])
    return graph


@settings(max_examples=60, deadline=None)
@given(connected_graphs(), st.sampled_from(SCHEMES))
def test_weights_are_symmetric_doubly_stochastic_with_positive_gamma(graph, scheme):
    t = topologies.from_graph(graph, weights=scheme)
    W = t.W
    assert np.allclose(W, W.T, atol=1e-12)
    assert np.allclose(W.sum(axis=0), 1, atol=1e-9) and np.allclose(W.sum(axis=1), 1, atol=1e-9)
    assert (W[~np.eye(t.size, dtype=bool)] >= 0).all()
    assert t.gamma > 0 and 0 < t.spectral_gap <= 1 + 1e-12


def random_shapes_run(comm, shapes, rank, iters, warm):
    g = torch.Generator().manual_seed(comm.rank)
    x = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    before = [t.clone() for t in x]
    gossip = PowerGossip(x, comm, rank=rank, num_iterations=iters, warm_start=warm, seed=5)
    for _ in range(3):
        gossip.step()
    return before, x, {j: gossip.factors(j) for j in comm.neighbors}


shapes = st.lists(
    st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple), min_size=1, max_size=5
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes,
    st.integers(1, 5),
    st.integers(1, 3),
    st.booleans(),
    st.sampled_from(["ring:5", "star:4", "torus:2x3", "complete:3"]),
)
def test_random_shapes_preserve_the_average_and_share_factors(shapes, rank, iters, warm, spec):
    topology = topologies.parse(spec)
    results = LocalCluster(topology).run(random_shapes_run, shapes, rank, iters, warm)
    for k in range(len(shapes)):
        before = torch.stack([r[0][k] for r in results]).mean(0)
        after = torch.stack([r[1][k] for r in results]).mean(0)
        assert torch.allclose(
            before, after, rtol=0, atol=1e-12 * max(1.0, float(before.abs().max()))
        )
    for i, j in topology.edges():
        mine, theirs = results[i][2][j], results[j][2][i]
        assert all(torch.equal(mine[key], theirs[key]) for key in mine)
