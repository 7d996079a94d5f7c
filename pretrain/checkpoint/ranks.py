"""How the ranks agree on a save or a resume: flags reduced in one all-reduce and one host read, lines gathered for
one message, and what counts as a failed collective rather than a failed write."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather(items: list[str]) -> list[str]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return items
    out: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, items)
    return [x for part in out for x in (part or [])]


def on_any_rank(flags: list[bool | torch.Tensor], device: torch.device | str) -> list[bool]:
    """Several agreements in one all-reduce and one host read: whether each flag (a bool, or a 0-d tensor left on
    the device) is set on any rank."""
    t = torch.stack([torch.as_tensor(f, device=device).to(torch.float32) for f in flags])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [v > 0 for v in t.tolist()]


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    return on_any_rank([flag], device)[0]


def is_comm_error(err: BaseException) -> bool:
    """A collective failed (dead peer, timeout): not a write error; re-raised at once, never waited on again."""
    text = str(err).lower()
    return isinstance(err, getattr(dist, "DistError", ())) or any(
        w in text for w in ("gloo", "nccl", "timed out")
    )
