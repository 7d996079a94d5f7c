"""Dedup phase 3: connected components of the edge graph (union-find per group, then the large-star /
small-star rounds of Kiveris et al. 2014) and the labels each component's non-root rows get."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.dedup.work import by_key, node_partition, read_key, save_npz
from data_pipeline.executors import Stage


def star_forest(edges: np.ndarray) -> np.ndarray:
    """Connected components of an edge list as [(root, member)] with root = the component's smallest gid.

    Vectorised min-label propagation with pointer jumping (numpy has no union-find; scipy is not a
    dependency): each round every edge pulls both ends to the smaller label, then labels jump to their
    label's label until stable. Star-shaped bucket edges converge in a few rounds.
    """
    if len(edges) == 0:
        return np.zeros((0, 2), np.uint64)
    nodes, inv = np.unique(edges.ravel(), return_inverse=True)
    u, v = inv.reshape(-1, 2).T
    label = np.arange(len(nodes))
    while True:
        m = np.minimum(label[u], label[v])
        new = label.copy()
        np.minimum.at(new, u, m)
        np.minimum.at(new, v, m)
        while True:
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            break
        label = new
    member = label != np.arange(len(nodes))
    return np.stack([nodes[label[member]], nodes[member]], axis=1)


def _save_routed(path: Path, edges: np.ndarray, partitions: int) -> None:
    """Write keyed edges (key node, neighbour) as one npz, member p<k> = the rows whose key is in partition k."""
    key = node_partition(edges[:, 0], partitions).astype(np.int64) if len(edges) else np.zeros(0, np.int64)
    save_npz(path, **by_key(edges, key, partitions, "p"))


def _both_ways(edges: np.ndarray) -> np.ndarray:
    return np.concatenate([edges, edges[:, ::-1]])


def components_l0_task(
    i: int, *, inputs: list[str], fan_in: int, out: str, partitions: int
) -> dict[str, Any]:
    """Union-find over edge files [i*F, (i+1)*F) -> star forest, keyed both ways for the first large-star step."""
    mine = inputs[i * fan_in : (i + 1) * fan_in]
    parts = [np.load(f) for f in mine]
    edges = np.concatenate(parts) if parts else np.zeros((0, 2), np.uint64)
    forest = star_forest(edges.astype(np.uint64, copy=False))
    _save_routed(Path(f"{out}-{i:05d}.npz"), _both_ways(forest), partitions)
    return {"edges_in": int(len(edges)), "members": int(len(forest))}


def _groups(keyed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique keyed edges sorted by (key, neighbour); per row its group's min neighbour and group size."""
    if len(keyed) == 0:
        z = np.zeros(0, np.uint64)
        return z, z, z, np.zeros(0, np.int64)
    keyed = np.unique(keyed, axis=0)  # sorted by key, then neighbour
    u, v = keyed[:, 0], keyed[:, 1]
    start = np.ones(len(u), bool)
    start[1:] = u[1:] != u[:-1]
    idx = np.nonzero(start)[0]
    sizes = np.diff(np.append(idx, len(u)))
    gmin = np.repeat(v[idx], sizes)  # sorted by neighbour within a key: the first is the smallest
    return u, v, gmin, np.repeat(sizes, sizes)


def _changed(marker_dir: str, stage: str, partitions: int) -> int | None:
    """Edges changed by a step (summed over its tasks), None when it was skipped at the fixed point."""
    stats = [
        json.loads((Path(marker_dir) / f"{stage}-{j:05d}.done").read_text())["stats"]
        for j in range(partitions)
    ]
    return None if any(s.get("skipped") for s in stats) else sum(s["changed"] for s in stats)


_FIXED: set[tuple[str, str]] = set()  # (marker dir, round's large step) known to be the fixed point


def step_done(stage: Stage, earlier_rounds: list[str], i: int) -> bool:
    """A step task is done when its marker exists (remotely on a remote run) or an earlier round changed nothing
    (the fixed point): the rounds after it are then not scheduled at all (no marker, no process), so a spare round
    costs nothing."""
    if stage.marker_exists(i):
        return True
    marker_dir, partitions = str(stage.marker_dir), stage.num_tasks
    for large in earlier_rounds:
        small = large.replace("-large", "-small")
        if (marker_dir, large) in _FIXED and (Path(marker_dir) / f"{small}-00000.done").exists():
            return True  # (a rerun after the work folder was deleted finds no marker and looks again)
        for attempt in range(2):
            try:
                if (
                    _changed(marker_dir, large, partitions) == 0
                    and _changed(marker_dir, small, partitions) == 0
                ):
                    _FIXED.add((marker_dir, large))
                    return True
                break
            except (OSError, ValueError, KeyError):  # that round has not run yet, or ran on another node
                if attempt or not stage.remote:
                    return False
                stage.pull(markers_only=True)
    return False


def star_step_task(
    i: int,
    *,
    kind: str,
    inputs: tuple[str, int],
    out: str,
    partitions: int,
    marker_dir: str,
    prev_round: list[str],
) -> dict[str, Any]:
    """One large-star or small-star step over the edges keyed by the nodes of partition i.

    large-star (input: both directions): node u with m = min(u, neighbours) links every neighbour v > u to m;
    output keyed by the larger end for small-star. small-star (input: keyed by the larger end, so each node sees
    its smaller neighbours N): m = min(N) and every v in N + {u}, v != m, links to m; output both directions.
    `changed` counts output edges that were not input edges; once a round changed nothing (the fixed point: a
    forest of stars centred on each component's smallest gid) the later rounds skip without reading anything.
    """
    if kind == "small" and json.loads(
        (Path(marker_dir) / f"dedup-components-large{out.rsplit('small', 1)[1]}-{i:05d}.done").read_text()
    )["stats"].get("skipped"):
        return {"skipped": "fixed point", "changed": 0}
    if prev_round and all(_changed(marker_dir, n, partitions) in (0, None) for n in prev_round):
        return {"skipped": "fixed point", "changed": 0}
    prefix, producers = inputs
    keyed = read_key([f"{prefix}-{j:05d}.npz" for j in range(producers)], f"p{i}", 2)
    u, v, gmin, size = _groups(keyed)
    if kind == "large":
        m = np.minimum(u, gmin)
        sel = v > u
        new = np.stack([v[sel], m[sel]], axis=1)  # v > u >= m: keyed by its larger end v
        changed = int((m[sel] != u[sel]).sum())
        _save_routed(Path(f"{out}-{i:05d}.npz"), new, partitions)
    else:
        sel = v != gmin  # the smaller neighbours other than the smallest move to it; u keeps its edge to it
        first = np.ones(len(u), bool)
        first[1:] = u[1:] != u[:-1]
        new = np.concatenate(
            [np.stack([v[sel], gmin[sel]], axis=1), np.stack([u[first], gmin[first]], axis=1)]
        )
        changed = int(sel.sum())
        _save_routed(Path(f"{out}-{i:05d}.npz"), _both_ways(new), partitions)
    return {
        "edges_in": int(len(u)),
        "edges_out": int(len(new)),
        "changed": changed,
        "max_degree": int(size.max()) if len(size) else 0,
    }


def labels_task(
    i: int,
    *,
    steps: list[tuple[str, str]],
    work: str,
    shard_names: tuple[str, ...],
    marker_dir: str,
    partitions: int,
    rounds: int,
    exact_files: list[str],
) -> dict[str, Any]:
    """remove/p<i>.npz: per input shard (member s<k>) the rows of partition i's nodes that are not their
    component's smallest gid, and (root<k>) the gid of that smallest document, the one kept. Reads the small-star
    output of the first round that changed nothing; fails when no round reached that fixed point."""
    src = None
    for k in range(1, len(steps), 2):
        if (
            _changed(marker_dir, steps[k - 1][0], partitions) == 0
            and _changed(marker_dir, steps[k][0], partitions) == 0
        ):
            src = steps[k][1]
            break
    if steps and src is None:
        last = _changed(marker_dir, steps[-1][0], partitions)
        raise RuntimeError(
            f"connected components did not converge in data.dedup.component_rounds={rounds} rounds "
            f"(the last round still changed {last} edges); raise it and rerun: finished tasks are "
            f"kept"
        )
    keyed = (
        read_key([f"{src}-{j:05d}.npz" for j in range(partitions)], f"p{i}", 2)
        if src
        else np.zeros((0, 2), np.uint64)
    )
    u, _, gmin, _ = _groups(keyed)
    first = np.ones(len(u), bool)
    first[1:] = u[1:] != u[:-1]
    members, roots = u[first], gmin[first]
    sel = roots < members  # at the fixed point a member's only neighbour is its root; a root's are larger
    members, roots = members[sel], roots[sel]
    shard = (members >> np.uint64(32)).astype(np.int64)
    rows = (members & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    save_npz(
        Path(work) / "remove" / f"p{i:05d}.npz",
        **by_key(rows, shard, len(shard_names), "s"),
        **by_key(roots, shard, len(shard_names), "root"),
    )
    exact = read_key(exact_files, f"n{i}", 0)
    near = ~np.isin(members, exact)
    examples = []
    for root in np.unique(roots[near])[:3]:
        ids = [root, *members[roots == root][:4]]
        examples.append([f"{shard_names[int(g) >> 32]}#{int(g) & 0xFFFFFFFF}" for g in ids])
    return {
        "members": int(len(members)),
        "clusters": int(len(np.unique(roots))),
        "cluster_examples": examples,
    }
