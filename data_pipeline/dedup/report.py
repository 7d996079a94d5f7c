"""The dedup report: every task's marker summed into dedup_stats.json, and the run's completion marker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.layout import DEDUP_STATS
from data_pipeline.dedup.minhash import expected_collision_probability
from data_pipeline.shards import (
    DEDUP_DONE,
    write_json_atomic,
)


def _marker_stats(marker_dir: Path, name: str, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(json.loads((marker_dir / f"{name}-{i:05d}.done").read_text())["stats"])
    return out


def finalize(
    dedup_root: str,
    fp: str,
    mh_kw: dict,
    ranges: int,
    marker_dir: str,
    shapes: list[tuple[str, int]],
    num_inputs: int,
) -> dict[str, Any]:
    """dedup_stats.json (merged from the task markers) and the _DONE.json marker of the whole stage."""
    root, marks = Path(dedup_root), Path(marker_dir)
    filt = _marker_stats(marks, "dedup-filter", num_inputs)
    per_source: dict[str, dict[str, int]] = {}
    for s in filt:
        c = per_source.setdefault(
            s["source"], {"docs_in": 0, "kept": 0, "exact_duplicates": 0, "near_duplicates": 0}
        )
        for k in c:
            c[k] += s[k]
    shapes_d = dict(shapes)
    buckets = (
        _marker_stats(marks, "dedup-buckets", shapes_d["dedup-buckets"])
        if "dedup-buckets" in shapes_d
        else []
    )
    labels = _marker_stats(marks, "dedup-components-labels", shapes_d["dedup-components-labels"])
    steps = [n for n in shapes_d if n.startswith(("dedup-components-large", "dedup-components-small"))]
    rounds_used = next(
        (
            k // 2
            for k in range(1, len(steps), 2)
            if not any(
                s["changed"] for n in steps[k - 1 : k + 1] for s in _marker_stats(marks, n, shapes_d[n])
            )
        ),
        0,
    )
    b, rr = mh_kw["bands"], mh_kw["rows"]
    stats = {
        "docs_in": sum(s["docs_in"] for s in filt),
        "kept": sum(s["kept"] for s in filt),
        "exact_duplicates": sum(s["exact_duplicates"] for s in filt),
        "near_duplicates": sum(s["near_duplicates"] for s in filt),
        "candidate_pairs": sum(s["pairs"] for s in buckets if s["kind"] == "near"),
        "per_source": per_source,
        "near_duplicate_cluster_examples": [e for s in labels for e in s["cluster_examples"]][:5],
        "partitions": ranges,
        "component_rounds_to_fixed_point": rounds_used,
        "tasks": dict(shapes),
        "minhash": {
            **mh_kw,
            "threshold": round((1 / b) ** (1 / rr), 3),
            "P(candidate|s)": {
                str(s): round(expected_collision_probability(s, b, rr), 4) for s in (0.5, 0.7, 0.8, 0.9)
            },
        },
        "fingerprint": fp,
    }
    write_json_atomic(root / DEDUP_STATS, stats)
    write_json_atomic(root / DEDUP_DONE, {"fingerprint": fp, "kept": stats["kept"]})
    return stats
