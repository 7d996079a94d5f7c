"""The training loop's speed while a save's background part writes and hashes a checkpoint in a thread of its process
(`checkpoint.async_mode: async`, the default), against the same loop with nothing in the background.

Why: a thread shares the interpreter lock with the loop. A GPU node's loop is host-bound Python (it launches kernels
and waits on nothing), so whatever the background holds the lock for is taken from the step. torch's own file writer
(`torch.save(obj, path)`, what DeepSpeed's TorchCheckpointEngine calls) holds the lock while it copies every byte;
our writer (`pretrain.checkpoint.writer.write_and_hash`) hands torch.save a Python file, whose writes
release it, and hashes in chunks that release it too.

Work: a loop of forward and backward passes of a small MLP on one thread (dispatch-bound, like a GPU loop's host),
timed for `--seconds` while a background thread writes and hashes a state dict of `--mb` MB in `--tensors` tensors
(the demo recipe's per-rank checkpoint is about 20 MB) over and over, then for the same time with nothing in the
background, alternating. The background also runs torch.save to the path (the way before, and DeepSpeed's) in each
round, printed beside as "before". One process, so a core is free for the background: what is measured is the lock,
not the cores (bench/checkpoint_stall.py measures the whole save on the step).

VERDICT: loop steps/s during our background write over steps/s with nothing in the background >= 0.8.

`python bench/checkpoint_gil.py [--rounds 7] [--seconds 2] [--mb 20] [--tensors 40]`
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import torch  # noqa: E402

from pretrain.checkpoint.writer import TorchFile, write_and_hash  # noqa: E402

GOAL = 0.8


def loop_rate(seconds: float, background: Callable[[threading.Event], None] | None) -> tuple[float, int]:
    """(steps/s of the loop, background writes finished) over `seconds`, with `background` running beside it."""
    stop, done = threading.Event(), [0]

    def run() -> None:
        while not stop.is_set():
            assert background is not None
            background(stop)
            done[0] += 1

    thread = threading.Thread(target=run, daemon=True) if background else None
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    x = torch.randn(8, 64)
    if thread:
        thread.start()
        time.sleep(0.05)  # the background's first write under way
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        model(x).sum().backward()
        n += 1
    rate = n / (time.perf_counter() - t0)
    stop.set()
    if thread:
        thread.join()
    return rate, done[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=2.0, help="loop time per measurement")
    ap.add_argument("--mb", type=float, default=20.0, help="size of the state dict written")
    ap.add_argument("--tensors", type=int, default=40)
    a = ap.parse_args()
    torch.set_num_threads(1)
    report = C.Report(__file__)
    n = int(a.mb * 2**20 / 4 / a.tensors)
    state = {f"layer{i}.weight": torch.randn(n) for i in range(a.tensors)}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-gil-") as tmp:
        folder = Path(tmp)

        def ours(stop: threading.Event) -> None:
            write_and_hash([TorchFile(folder / "ours.pt", state, atomic=False)], folder, ["ours.pt"])

        def before(stop: threading.Event) -> None:
            torch.save(state, folder / "before.pt")  # torch's file writer, as DeepSpeed's engine calls it
            write_and_hash([], folder, ["before.pt"])

        report.line(
            f"loop: 8 x Linear(64, 64) forward and backward, batch 8, 1 thread; background: {a.tensors} tensors, "
            f"{a.mb:g} MB, written and hashed over and over; {a.seconds:g} s per measurement"
        )
        ours(threading.Event())
        loaded = torch.load(folder / "ours.pt")
        if not all(torch.equal(loaded[k], v) for k, v in state.items()):
            raise SystemExit("our write does not load back as the state it was given")
        rates: dict[str, list[float]] = {"ours": [], "idle": [], "before": []}
        writes: dict[str, list[int]] = {"ours": [], "before": []}

        def measure(kind: str) -> float:
            rate, done = loop_rate(a.seconds, {"ours": ours, "before": before, "idle": None}[kind])
            rates[kind].append(rate)
            if kind in writes:
                writes[kind].append(done)
            return rate

        o, p = C.alternate(lambda: measure("ours"), lambda: (measure("before"), measure("idle"))[1], a.rounds)
    med = statistics.median
    for kind in ("ours", "before"):
        per_s = med(writes[kind]) / a.seconds
        report.line(
            f"{kind}: loop {med(rates[kind]):.0f} steps/s ({med(rates[kind]) / med(rates['idle']):.2f} of idle, "
            f"{med(rates['idle']):.0f}) with {per_s:.1f} background writes/s"
        )
    report.compare("checkpoint_write_loop_speed_vs_idle", o, p, GOAL, unit="loop steps/s")
    return report.finish()


if __name__ == "__main__":
    raise SystemExit(main())
