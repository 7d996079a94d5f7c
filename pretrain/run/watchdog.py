"""Hangs and stragglers named while the run is alive (issue 44, items 3 and 4).

A collective that one rank never reaches ends, after `deepspeed.comm_timeout_s`, with an error on the rank that
noticed, not on the one that is stuck. Here every rank keeps a heartbeat (step, micro-batch, phase, host) that a
thread writes to the job's store (the TCPStore of the process group) every `watchdog.heartbeat_s`. When a rank
makes no progress for `watchdog.hang_timeout_s` (below the collective timeout, so the stuck rank is still alive),
or a collective raises its timeout, that rank raises a flag in the store; every rank that sees it dumps its Python
stacks (faulthandler, all threads) and, on NCCL, torch's flight recorder into <run>/logs/hang/, reads the others'
heartbeats, names the ranks and hosts that are behind, and exits HUNG (core/exit_codes.py).

Issue 64: time the process itself was not running (the whole job suspended: SIGSTOP, `scontrol suspend`, Ctrl-Z, a
paused VM) is not time without progress (`Suspensions`), so a suspended job goes on after SIGCONT. The store's
heartbeat follows each beat within `publish_gap`, so a frozen rank is named at the step it froze in; silence is
judged on the reporting rank's own clock after it fired; a rank found stopped on the reporting host is ended. A hung
run ends within `watchdog.hang_timeout_s` + `hang_grace_s` (3 heartbeats + 5 s).

The hot path stays free of device reads: the loop's beats and the forward hooks only assign a tuple, read the host
clock and set an Event that wakes the thread; the store is written by the thread. Per-rank figures (forward time, loader wait) are gathered at
logging steps only, over a gloo group on host tensors (`gather_step_figures`), so they never read the device.
"""

from __future__ import annotations

import atexit
import faulthandler
import itertools
import json
import logging
import math
import os
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from core.exit_codes import HUNG
from core.io import atomic_write
from core.log import get_logger

log = get_logger(__name__)

# A straggler is also slower than the median by at least this many seconds per step: steps of milliseconds (a tiny
# model on CPU) jitter by more than `watchdog.straggler_factor` without any rank being slow.
STRAGGLER_MIN_EXCESS_S = 0.05
# Phases of a step in the order a rank passes them; a rank "behind" another is at an earlier (step, micro, phase).
PHASES = {"data": 0, "forward": 1, "backward": 2, "after": 3}
PHASE_TEXT = {
    "data": "waiting for its first batch",
    "forward": "in the forward of micro-batch {micro}",
    "backward": "in the backward/optimizer step of micro-batch {micro} (gradient reduction included)",
    "after": "after the step (logging, evaluation, checkpoint)",
}
FLIGHT_RECORDER_ENTRIES = 2000  # torch's NCCL flight recorder ring (TORCH_NCCL_TRACE_BUFFER_SIZE) unless set

_active: Watchdog | None = None


def find_stragglers(own: list[float], factor: float, min_excess_s: float) -> list[int]:
    """Ranks whose own time per step exceeds the median rank's by `factor` and by `min_excess_s` seconds: the
    absolute floor keeps millisecond steps' jitter (a tiny model on CPU, where 2 ranks' median is their mean) from
    being reported as a slow rank."""
    median = statistics.median(own)
    return [r for r, t in enumerate(own) if median > 0 and t > factor * median and t - median > min_excess_s]


def hang_limit(cfg: Any) -> float:
    """Seconds without progress that count as a hang: `watchdog.hang_timeout_s`, else 90% of the collective
    timeout."""
    return cfg.watchdog.hang_timeout_s or 0.9 * cfg.deepspeed.comm_timeout_s


def hang_grace_s(interval: float) -> float:
    """Seconds after `watchdog.hang_timeout_s` within which a hung run has ended: a heartbeat period for the
    thread to notice, two for the other ranks to dump (or be found silent) plus 2 s, and 3 s to dump, write the
    report and end a stopped rank on this host."""
    return 3 * interval + 5.0


class Suspensions:
    """Time this process spent not running (SIGSTOP: `scontrol suspend`, gang scheduling, Ctrl-Z; a paused VM),
    seen by the heartbeat thread as a wait that ended far later than it asked for while the process used almost
    no CPU. CLOCK_MONOTONIC keeps counting while a process is stopped, so without this every rank of a suspended
    job finds itself past the hang limit at SIGCONT. A late wake-up while the process burned CPU (the main thread
    holding the interpreter) is not a suspension, nor one under `floor_s` late (scheduling jitter)."""

    def __init__(self, floor_s: float):
        self.floor_s = floor_s
        self.spans: list[tuple[float, float]] = []  # (monotonic time the thread woke, seconds not running)
        self.last_end = -math.inf  # the wake-up that ended the latest suspension

    def observe(self, start: float, end: float, asked_s: float, cpu_s: float) -> float:
        """One wait of the thread, from `start` to `end` (monotonic), for `asked_s` at most, during which the
        process used `cpu_s` of CPU: the seconds it was suspended (0.0: it was not)."""
        late = (end - start) - asked_s
        if late <= self.floor_s or cpu_s >= late / 2:
            return 0.0
        self.spans.append((end, late))
        self.last_end = end
        return late

    def idle(self, since: float, now: float) -> float:
        """Seconds from `since` to `now` (monotonic) that the process was running: only the part of a
        suspension after `since` is taken off."""
        return (now - since) - sum(min(late, end - since) for end, late in self.spans if end > since)

    def forget_before(self, since: float) -> None:
        """Suspensions that ended before the latest progress no longer matter."""
        self.spans = [(end, late) for end, late in self.spans if end > since]


def flight_recorder_env(hang_dir: Path) -> None:
    """Switch on torch's NCCL flight recorder before the process group exists (as torchtitan does): a ring of the
    last collectives per rank, dumped by NCCL's own watchdog on its timeout into `hang_dir` and by ours on a hang.
    A value the user set is kept."""
    hang_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", str(FLIGHT_RECORDER_ENTRIES))
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(hang_dir / "nccl-trace-rank-"))


def describe(beat: dict[str, Any], now: float) -> str:
    text = PHASE_TEXT.get(beat["phase"], beat["phase"]).format(micro=beat.get("micro", 0))
    return f"step {beat['step']}, {text}, for {now - beat['since']:.1f} s"


def behind(
    beats: dict[int, dict[str, Any] | None], now: float, stale_s: float, silent: dict[int, str] | None = None
) -> dict[int, str]:
    """The ranks that did not arrive where the furthest rank is, each with why: an earlier (step, micro-batch,
    phase), no heartbeat at all, or a silent heartbeat (a dead or stopped process, or one whose interpreter is
    stuck in native code holding the GIL). `silent` ({rank: what is known of its process}) is what the hang
    procedure saw: heartbeats that did not move while it watched, on its own clock. Without it, a heartbeat
    older than `stale_s` by the wall clock is silent."""
    seen = {r: b for r, b in beats.items() if b is not None}
    out = {
        r: "no heartbeat in the store (never reached the loop, or died)"
        for r, b in beats.items()
        if b is None
    }
    if not seen:
        return out
    front = max(_order(b) for b in seen.values())
    for r, b in seen.items():
        is_silent = r in silent if silent is not None else now - b["updated"] > stale_s
        if is_silent:
            note = f": {silent[r]}" if silent and silent[r] else ""
            out[r] = (
                f"heartbeat silent for {now - b['updated']:.0f} s (dead or frozen{note}); last at "
                f"{describe(b, now)}"
            )
        elif _order(b) < front:
            out[r] = describe(b, now)
    return out


def _order(beat: dict[str, Any]) -> tuple[int, int, int]:
    phase = PHASES.get(beat["phase"], 0)
    return beat["step"], (1 << 30) if phase == PHASES["after"] else beat.get("micro", 0), phase


def hang_report(
    beats: dict[int, dict[str, Any] | None],
    reason: str,
    hang_dir: Path,
    stale_s: float,
    silent: dict[int, str] | None = None,
) -> str:
    """The message every rank logs and writes to logs/hang/report.txt: who did not arrive, where every rank is,
    where the stacks are (`stale_s`, `silent`: see `behind`)."""
    now = time.time()
    late = behind(beats, now, stale_s, silent)
    host = {r: (b or {}).get("host", "?") for r, b in beats.items()}
    if late:
        head = "; ".join(f"rank {r} (host {host[r]}): {why}" for r, why in sorted(late.items()))
        head = f"ranks that did not arrive: {head}"
    else:
        head = (
            "every rank reached the same point: the collective itself is stuck (network, NCCL, a dead link)"
        )
    lines = [f"hang: {reason}", head, "where each rank is:"]
    for r, b in sorted(beats.items()):
        lines.append(f"  rank {r} (host {host[r]}): " + ("no heartbeat" if b is None else describe(b, now)))
    lines.append(
        f"stacks: {hang_dir}/rank-<N>.txt on each rank's host (NCCL flight recorder: nccl-trace-rank-<N>)"
    )
    return "\n".join(lines)


class Watchdog:
    """One per rank: the loop's beats, forward timing hooks on the engine, the heartbeat thread, the hang
    procedure and the per-rank step figures. `start` makes it; `stop` ends the thread before teardown."""

    def __init__(self, cfg: Any, engine: torch.nn.Module, hang_dir: Path, rank: int, world: int):
        self.rank, self.world, self.hang_dir = rank, world, hang_dir
        self.limit, self.long_limit = hang_limit(cfg), float(cfg.deepspeed.comm_timeout_s)
        self.interval = cfg.watchdog.heartbeat_s
        self.factor = cfg.watchdog.straggler_factor
        self.min_excess_s = STRAGGLER_MIN_EXCESS_S
        self.host = socket.gethostname()
        self.enabled = cfg.watchdog.enabled
        self.beat_state = (0, 0, "data", time.time(), time.monotonic())
        self.steps_begun = 0
        self.micro, self.fwd_t0, self.fwd_s, self.window_steps = 0, 0.0, 0.0, 0
        # suspensions under a second (or a heartbeat) are left in: scheduling jitter on a loaded host
        self.suspensions = Suspensions(floor_s=max(1.0, self.interval))
        # the store follows the loop within this (the thread is woken by each beat), not only every heartbeat
        self.publish_gap = min(self.interval, max(0.05, self.interval / 20))
        self._seq = itertools.count()
        self._dumped = False
        self._changed = threading.Event()
        self._done = threading.Event()
        self._main_clock = _thread_clock(threading.main_thread())
        self._fired = threading.Lock()
        self.prefix = f"lmstack/watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.store = _default_store()
        # a gloo group for the per-rank figures: host tensors, no device read (the default group is NCCL on a GPU)
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        hosts: list[Any] = [None] * world  # set-up only: the host names of the straggler lines
        dist.all_gather_object(hosts, self.host, group=self.group)
        self.hosts = [str(h) for h in hosts]
        engine.register_forward_pre_hook(self._forward_begins)
        engine.register_forward_hook(self._forward_ends)
        self.thread = threading.Thread(target=self._watch, name="lmstack-watchdog", daemon=True)

    @classmethod
    def start(cls, cfg: Any, engine: torch.nn.Module, hang_dir: Path) -> Watchdog:
        global _active
        dog = cls(cfg, engine, hang_dir, dist.get_rank(), dist.get_world_size())
        if dog.enabled and dog.store is not None:
            dog.thread.start()
            # a run that ends on an error (CannotContinue) is not a hang while the interpreter tears down
            atexit.register(dog.stop)
        _active = dog
        return dog

    # --- the loop's side: no device reads, no store traffic --------------------------------------------------
    def beat(self, step: int, phase: str) -> None:
        """Progress: `step` is the step being worked on ("data": it begins) or just finished ("after")."""
        if phase == "data":
            self.micro = 0
            self.steps_begun += 1
            self.window_steps += 1
        self.beat_state = (step, self.micro, phase, time.time(), time.monotonic())
        self._changed.set()

    def _forward_begins(self, module: torch.nn.Module, args: Any) -> None:
        if not module.training:  # evaluation and the parity probe are not training steps
            return
        step = self.beat_state[0]
        self.beat_state = (step, self.micro, "forward", time.time(), time.monotonic())
        self._changed.set()
        self.fwd_t0 = time.perf_counter()

    def _forward_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not module.training:
            return
        self.fwd_s += time.perf_counter() - self.fwd_t0
        self.beat_state = (self.beat_state[0], self.micro, "backward", time.time(), time.monotonic())
        self._changed.set()
        self.micro += 1

    def stop(self) -> None:
        self._done.set()
        self._changed.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2 * self.interval)

    # --- stragglers (logging steps only) ---------------------------------------------------------------------
    def step_figures(self, step: int, loader_wait_s: float) -> dict[str, float]:
        """Each rank's own time per step since the last logging step (forward passes and loader wait: the waits
        for other ranks, which make every rank's wall time equal, are left out), gathered over the gloo group in
        one small all_gather. Ranks above `watchdog.straggler_factor` x the median are logged by host and rank
        (rank 0) and counted. Every rank calls it at the same steps."""
        n = max(self.window_steps, 1)
        mine = [self.fwd_s / n, loader_wait_s / n]
        self.fwd_s, self.window_steps = 0.0, 0
        rows = gather_step_figures(mine, self.world, self.group)
        own = [f + w for f, w in rows]
        median = statistics.median(own)
        slow = find_stragglers(own, self.factor, self.min_excess_s)
        if self.rank == 0:
            for r in slow:
                log.warning(
                    f"[train] straggler at step {step}: rank {r} (host {self.hosts[r]}) {own[r]:.3f} s/step of its "
                    f"own work (forward {rows[r][0]:.3f} s, loader wait {rows[r][1]:.3f} s), "
                    f"{own[r] / median:.1f}x the median rank's {median:.3f} s (watchdog.straggler_factor "
                    f"{self.factor})"
                )
        worst = max(range(self.world), key=lambda r: own[r])
        return {
            "stragglers": len(slow),
            "step_time_max_rank": worst,
            "step_time_max_s": own[worst],
            "step_time_median_s": median,
            "loader_wait_max_s": max(w for _, w in rows),
        }

    # --- the thread ------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Publish each new beat within `publish_gap` (so a rank frozen between two heartbeats is found where it
        was), and every `interval` look for a hang: this rank's time without progress, less the time the process
        itself was not running (Suspensions), against the limit, and the store's flag."""
        published: tuple[Any, ...] | None = None
        last_publish, next_check = -math.inf, time.monotonic() + self.interval
        while not self._done.is_set():
            now = time.monotonic()
            if self.beat_state is not published and now - last_publish >= self.publish_gap:
                published, last_publish = self.beat_state, now
                self._try(self._publish)
            if now >= next_check:
                self._check(now)
                next_check = time.monotonic() + self.interval
                continue
            self._changed.clear()  # before reading the state: a beat from here on wakes the wait below
            pending = self.beat_state is not published
            until = min(next_check, last_publish + self.publish_gap) if pending else next_check
            asked = max(0.0, until - time.monotonic())
            t0, cpu0 = time.monotonic(), self._main_cpu()
            # a change within the gap waits out the gap (not woken by every beat of a fast loop)
            (self._done if pending else self._changed).wait(asked)
            gone = self.suspensions.observe(t0, time.monotonic(), asked, self._main_cpu() - cpu0)
            if gone:
                log.warning(
                    f"[train] rank {self.rank} (host {self.host}) was not running for {gone:.0f} s (suspended: "
                    "SIGSTOP, scontrol suspend, Ctrl-Z or a paused VM); that time is not counted as time without "
                    "progress (watchdog.hang_timeout_s)"
                )

    def _check(self, now: float) -> None:
        try:
            self._publish()
            flagged = self.store.add(self.prefix + "flag", 0) > 0
        except Exception as e:  # a store gone (teardown, a dead master): nothing to coordinate with
            log.debug(f"watchdog: store unreachable: {e}")
            flagged = False
        step, micro, phase, since, mono = self.beat_state
        self.suspensions.forget_before(mono)
        idle = self.suspensions.idle(mono, now)
        limit = self.long_limit if phase == "after" or self.steps_begun <= 1 else self.limit
        if self._done.is_set():
            return
        if flagged:
            self.fire("another rank reported a hang")
        elif idle > limit:
            self.fire(
                f"rank {self.rank} (host {self.host}) made no progress for {idle:.0f} s "
                f"(limit {limit:.0f} s) at step {step}"
            )

    def _main_cpu(self) -> float:
        """CPU seconds of the loop's thread (it does not advance while the process is stopped, and does while the
        loop holds the interpreter in a long call); the process's where a thread's clock cannot be read."""
        try:
            return (
                time.clock_gettime(self._main_clock) if self._main_clock is not None else time.process_time()
            )
        except OSError:
            return time.process_time()

    @staticmethod
    def _try(call: Any) -> Any:
        try:
            return call()
        except Exception as e:  # a store gone (teardown, a dead master): nothing to coordinate with
            log.debug(f"watchdog: store unreachable: {e}")
            return None

    def _beat(self) -> dict[str, Any]:
        """This rank's heartbeat as the store keeps it."""
        step, micro, phase, since, _ = self.beat_state
        beat = {"host": self.host, "pid": os.getpid(), "step": step, "micro": micro, "phase": phase}
        return {
            **beat,
            "since": since,
            "updated": time.time(),
            "seq": next(self._seq),
            "dumped": self._dumped,
        }

    def _publish(self) -> None:
        self.store.set(f"{self.prefix}hb/{self.rank}", json.dumps(self._beat()))

    def hang_raised(self) -> bool:
        """This process's watchdog is reporting a hang, or some rank has raised one in the store."""
        if self._fired.locked():
            return True
        try:
            return self.store.add(self.prefix + "flag", 0) > 0
        except Exception:  # the store's host is gone: nothing to tell
            return False

    def fire(self, reason: str) -> None:
        """Dump, name the ranks behind, exit HUNG. Runs once per process (the thread, or the main thread after a
        collective timed out); never returns. Ends within `hang_grace_s` of the limit: the other ranks get two
        heartbeat periods and 2 s to dump (or to be found silent), and a rank found stopped on this host is ended
        here, as torchrun's SIGTERM cannot end it (it would wait 30 s before its SIGKILL)."""
        if not self._fired.acquire(blocking=False):
            threading.Event().wait()  # the other thread is already reporting and will end the process
        self._done.set()
        try:
            self._publish()
            if self.store.add(self.prefix + "flag", 1) == 1:
                self.store.set(self.prefix + "reason", reason)
        except Exception as e:
            log.debug(f"watchdog: store unreachable: {e}")
        self.dump_stacks(reason)
        self._dumped = True
        beats, silent = self._wait_for_peers()
        reason = self._first_reason(reason)
        notes, stopped = self._silent_processes(beats, silent)
        report = hang_report(beats, reason, self.hang_dir, stale_s=3 * self.interval + 5, silent=notes)
        # every rank writes it (atomically): the first to finish exits, and torchrun then ends the others at once
        atomic_write(self.hang_dir / "report.txt", report + "\n")
        log.error(f"[train] rank {self.rank}: {report}")
        for r, pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
                log.error(f"[train] rank {self.rank}: ended rank {r} (pid {pid}, stopped) with SIGKILL")
            except OSError as e:
                log.warning(f"[train] rank {self.rank}: could not end rank {r} (pid {pid}): {e}")
        for h in logging.getLogger().handlers + log.handlers:
            h.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(HUNG)

    def dump_stacks(self, reason: str) -> None:
        self.hang_dir.mkdir(parents=True, exist_ok=True)
        with open(self.hang_dir / f"rank-{self.rank}.txt", "w") as f:
            f.write(f"rank {self.rank} of {self.world}, host {self.host}, pid {os.getpid()}\n")
            f.write(f"at {describe(self._beat(), time.time())}\nreason: {reason}\nthreads:\n")
            for t in threading.enumerate():  # faulthandler names threads by id only
                f.write(f"  Thread 0x{t.ident or 0:016x}: {t.name}\n")
            f.write("\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        dump_nccl = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
        if dump_nccl is not None and dist.get_backend() == "nccl":
            try:
                (self.hang_dir / f"nccl-trace-rank-{self.rank}.pkl").write_bytes(dump_nccl())
            except Exception as e:  # the recorder is off (TORCH_NCCL_TRACE_BUFFER_SIZE=0), or not built
                log.warning(f"[train] rank {self.rank}: no NCCL flight recorder dump: {e}")

    def _wait_for_peers(self) -> tuple[dict[int, dict[str, Any] | None], set[int]]:
        """Every rank's heartbeat, and the silent ranks. Waits until every other rank has dumped its stacks, or
        for two heartbeat periods and 2 s (one period more when this process was itself suspended just before,
        so that the others, resumed with it, have written a fresh heartbeat); a rank that did not dump and whose
        heartbeat did not move while this one watched is silent. Judged on this process's own clock and on
        heartbeats written after it fired, never on a heartbeat's age by another host's clock or on one written
        before a suspension. This rank's own heartbeat is its current one: never silent."""
        beats: dict[int, dict[str, Any] | None] = dict.fromkeys(range(self.world))
        silent: set[int] = set()
        try:
            first = self._read_beats()
            deadline = (
                max(time.monotonic(), self.suspensions.last_end + self.interval) + 2 * self.interval + 2.0
            )
            while True:
                self._publish()  # alive while it waits: the others must not find this rank silent
                beats = self._read_beats()
                waiting = [
                    r for r in range(self.world) if r != self.rank and not (beats[r] or {}).get("dumped")
                ]
                if not waiting or time.monotonic() >= deadline:
                    break
                time.sleep(min(0.5, self.interval))
            for r in waiting:
                was, now = first[r], beats[r]
                if was is not None and now is not None and was.get("seq") == now.get("seq"):
                    silent.add(r)
        except Exception as e:
            log.debug(f"watchdog: store unreachable: {e}")
        beats[self.rank] = self._beat()
        return beats, silent

    def _read_beats(self) -> dict[int, dict[str, Any] | None]:
        keys = [f"{self.prefix}hb/{r}" for r in range(self.world)]
        if self.store.check(keys):  # every rank has published: one round trip
            try:
                return {r: json.loads(v) for r, v in enumerate(self.store.multi_get(keys))}
            except (AttributeError, NotImplementedError, RuntimeError):  # a store without multi_get
                pass
        return {
            r: json.loads(self.store.get(k)) if self.store.check([k]) else None for r, k in enumerate(keys)
        }

    def _silent_processes(
        self, beats: dict[int, dict[str, Any] | None], silent: set[int]
    ) -> tuple[dict[int, str], list[tuple[int, int]]]:
        """What this host can tell of each silent rank's process ({rank: note}; "" on another host), and the
        (rank, pid) of those stopped here (state T) by a process of the same job (the same parent)."""
        notes: dict[int, str] = {}
        stopped: list[tuple[int, int]] = []
        for r in sorted(silent):
            beat = beats[r] or {}
            pid = beat.get("pid")
            notes[r] = ""
            if beat.get("host") != self.host or not isinstance(pid, int):
                continue
            state = process_state(pid)
            if state is None:
                notes[r] = f"process {pid} is gone"
            elif state[0] == "T" and state[1] == os.getppid():
                notes[r] = f"process {pid} is stopped (state T: SIGSTOP, Ctrl-Z), ended by rank {self.rank}"
                stopped.append((r, pid))
            elif state[0] == "D":
                notes[r] = (
                    f"process {pid} is in uninterruptible sleep (state D: a driver or file system call)"
                )
            else:
                notes[r] = f"process {pid} is in state {state[0]}: its heartbeat thread does not run"
        return notes, stopped

    def _first_reason(self, reason: str) -> str:
        try:
            key = self.prefix + "reason"
            return self.store.get(key).decode() if self.store.check([key]) else reason
        except Exception:
            return reason


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process on this host from /proc (Linux), or None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": the name may hold spaces
    return fields[0], int(fields[1])


def _thread_clock(thread: threading.Thread) -> int | None:
    """The CPU-time clock of `thread` (Linux, macOS), or None."""
    try:
        return time.pthread_getcpuclockid(thread.ident or 0)
    except (AttributeError, OSError):
        return None


def _default_store() -> Any:
    """The process group's store (torchrun's TCPStore behind a prefix), or None where there is none."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def gather_step_figures(mine: list[float], world: int, group: Any) -> list[list[float]]:
    """[forward s/step, loader wait s/step] of every rank, in one all_gather of host tensors over a gloo group: no
    device read on an accelerator (a world of one gathers nothing)."""
    if world == 1:
        return [mine]
    rows = [torch.zeros(len(mine), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(rows, torch.tensor(mine, dtype=torch.float64), group=group)
    return torch.stack(rows).tolist()


def collective_failed(error: BaseException) -> None:
    """From the entry point's last handler: a collective that timed out goes through the hang procedure (dumps,
    the ranks named, exit HUNG) instead of a bare traceback; anything else returns."""
    if _active is None or not _active.enabled:
        return
    text = str(error).lower()
    first = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    if "timed out" in text or "timeout" in text:
        _active.fire(f"rank {_active.rank}: a collective timed out: {first}")
    # a peer that ended after its report broke this rank's collective ("Connection closed by peer")
    if _active.hang_raised():
        _active.fire(f"rank {_active.rank}: a collective broke while a hang was reported: {first}")
