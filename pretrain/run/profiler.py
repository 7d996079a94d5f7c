"""`logging.profile_steps: [start, end]`: a torch.profiler trace of optimizer steps start..end-1 in the run's logs
folder, plus a text summary a person reads first: the top ops and kernels by time, the device's idle fraction over
the window (CUDA only; n/a on CPU), the host reads of tensors and device synchronizations per step (each one stalls
the device on a GPU), and where each came from: the loop's phase (`lmstack.<phase>` labels, see `phase`) and the ops
around it.

Files (per rank): `<run>/logs/profile/trace-rank<r>.json` (open in chrome://tracing or Perfetto) and
`<run>/logs/profile/summary-rank<r>.txt`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from core.log import get_logger

log = get_logger(__name__)

# the op behind .item(), .tolist(), bool() and float() of a tensor; the runtime calls that block the host on a GPU
HOST_READ_OPS = ("aten::_local_scalar_dense",)
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
PHASE_PREFIX = "lmstack."
# What the host-read figure counts: the op torch runs for a scalar read (from Python or inside a C++ kernel: CPU
# fused AdamW reads its state's scalars on the host, once per tensor it steps; on CUDA its kernel reads them on the
# device). A `.tolist()` or `.cpu()` copy is no op in the trace: the loop's one read per step (StepSync) is such a
# copy, counted by tests/pretrain/test_host_syncs.py and not here.
READS_NOTE = (
    "  (scalar reads by ops: .item(), float(), bool() and kernels' own, e.g. CPU fused AdamW's of its state; "
    "a .tolist() or .cpu() copy, such as the loop's one read per step, is no op and not counted)"
)


def phase(name: str) -> Any:
    """A label for one phase of the training step in a profile (`lmstack.forward`, ...): a sync found inside it is
    reported with the phase's name. Costs a few microseconds when no profiler runs."""
    return torch.profiler.record_function(PHASE_PREFIX + name)


class StepProfiler:
    """Profiles the steps of a window; a no-op without one. `begin(step)` before a step's first micro-batch,
    `end(step)` once its optimizer step and its host read are done."""

    def __init__(self, window: tuple[int, int] | None, folder: Path, rank: int, device: torch.device):
        self.window, self.folder, self.rank, self.device = window, Path(folder) / "profile", rank, device
        self.prof: Any = None

    def begin(self, step: int) -> None:
        if self.window is None or step != self.window[0]:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities, record_shapes=False)
        self.prof.__enter__()

    def end(self, step: int, finished: bool = False) -> None:
        if self.prof is None or self.window is None:
            return
        first, stop = self.window
        if step < stop - 1 and not finished:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the window's last kernels belong to it
        self.prof.__exit__(None, None, None)
        prof, self.prof = self.prof, None
        n_steps = step - first + 1
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / f"trace-rank{self.rank}.json"
        prof.export_chrome_trace(str(trace))
        text = summarize(prof, n_steps, self.device.type, (first, step))
        (self.folder / f"summary-rank{self.rank}.txt").write_text(text)
        if self.rank == 0:
            log.info(f"[profile] steps {first}..{step}: {trace} and its summary\n{text}")


def summarize(prof: Any, n_steps: int, device_type: str, steps: tuple[int, int], top: int = 15) -> str:
    """The summary text: top ops by self time (device time first on a GPU), idle fraction, host reads per step."""
    events = prof.key_averages()
    on_gpu = device_type == "cuda"
    sort = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    lines = [f"profile of optimizer steps {steps[0]}..{steps[1]} ({n_steps} steps, device {device_type})", ""]
    lines.append(f"top {top} ops/kernels by {'device' if on_gpu else 'host'} self time:")
    lines.append(events.table(sort_by=sort, row_limit=top))
    reads = sum(e.count for e in events if e.key in HOST_READ_OPS)
    syncs = sum(e.count for e in events if e.key in SYNC_CALLS)
    lines.append(
        f"host reads of tensors ({', '.join(HOST_READ_OPS)}): {reads} = {reads / n_steps:.2f} per step"
    )
    lines.append(READS_NOTE)
    if on_gpu:
        lines.append(
            f"device synchronize calls ({', '.join(SYNC_CALLS)}): {syncs} = {syncs / n_steps:.2f} per step"
        )
    sites = call_sites(prof, HOST_READ_OPS + (SYNC_CALLS if on_gpu else ()))
    if sites:
        lines.append("where they were called (count: phase: ops around it, outermost first):")
        lines += [f"  {n}: {site}" for site, n in sites.most_common()]
    idle = device_idle_fraction(prof) if on_gpu else None
    lines.append(
        "device idle fraction: " + ("n/a (no device timeline on CPU)" if idle is None else f"{idle:.1%}")
    )
    return "\n".join(lines) + "\n"


def call_sites(prof: Any, names: tuple[str, ...]) -> Counter:
    """Each event named in `names` (host reads, sync calls) by the loop phase and the ops that enclose it in time:
    "optimizer_step: aten::_fused_adamw_ > aten::item". Containment in time on any host thread, since the CUDA
    runtime's calls and the ops above them are not always reported on the same thread id."""
    host = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU]
    sites: Counter = Counter()
    for e in host:
        if e.name not in names:
            continue
        start, end = e.time_range.start, e.time_range.end
        around = [
            o
            for o in host
            if o is not e
            and o.time_range.start <= start
            and o.time_range.end >= end
            and (o.name.startswith(("aten::", PHASE_PREFIX)) or o.name in names)
        ]
        around.sort(key=lambda o: o.time_range.start)  # outermost first
        phases = [o.name[len(PHASE_PREFIX) :] for o in around if o.name.startswith(PHASE_PREFIX)]
        ops = [o.name for o in around if not o.name.startswith(PHASE_PREFIX)][-3:]
        sites[f"{phases[-1] if phases else 'outside the step phases'}: {' > '.join([*ops, e.name])}"] += 1
    return sites


def device_idle_fraction(prof: Any) -> float | None:
    """1 - (union of kernel intervals) / (first kernel start .. last kernel end) over the window."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return None
    busy, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    busy += cur_end - cur_start
    total = spans[-1][1] - spans[0][0]
    return max(0.0, 1.0 - busy / total) if total > 0 else None
