"""The exit codes of every lmstack command, in one place: what a shell script, torchrun or a Slurm script does
with each one (the generated sbatch scripts requeue on PREEMPTED alone).

- 0: done;
- 1 (FAILED): a bug or an unexpected error, with its traceback;
- 2 (USAGE): a bad key, file, host or name, said in one line before any work (argparse's code too);
- 65 (CANNOT_CONTINUE, sysexits' EX_DATAERR): the run cannot go on and a restart would fail the same way (a full
  disk, no usable checkpoint, diverged weights, a refused config change, a run folder held by another run);
- 69 (HUNG, sysexits' EX_UNAVAILABLE): a rank stopped making progress (a collective that some ranks never reached):
  every rank dumped its stacks into <run>/logs/hang and the ranks and hosts that did not arrive were named;
- 75 (PREEMPTED, EX_TEMPFAIL): checkpointed on a signal: requeue me;
- 79 (LOSS_SPIKE, lmstack's own, past sysexits' range): training stopped on a loss spike (`spikes.action: stop`,
  or `spikes.max_consecutive` spikes in a row); the last complete checkpoint is left as it was;
- 128 + signal (130 for SIGINT, 143 for SIGTERM): stopped by a signal with nothing to requeue, the shell's
  convention.
"""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
CANNOT_CONTINUE = 65
HUNG = 69
PREEMPTED = 75
LOSS_SPIKE = 79


def stopped_by(signum: int) -> int:
    """The shell's exit code for a command stopped by signal `signum`."""
    return 128 + int(signum)
