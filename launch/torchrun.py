"""torchrun, exiting with what the ranks said: `python -m launch.torchrun <torchrun options> -m <module> ...`.

torchrun ends every worker failure with exit 1 and a ChildFailedError traceback that names the first rank to
fail as the "root cause". For lmstack's ranks that loses the one thing a script acts on: after a hang the
reporting rank exits 69 (HUNG) and the hung one is killed, so torchrun named rank 0 and exited 1, and a Slurm
script could not tell a hang (do not requeue) from a preemption (75) or a full disk (65). This wrapper runs
torchrun's own `run` in this process (the same agent, options and signal handling; the ranks stay this
process's children, as `launch run`'s signal forwarding expects) and turns a ChildFailedError into one line and
the ranks' most telling exit code (`node_exit_code`). Everything else torchrun does is untouched.
"""

from __future__ import annotations

import signal
import sys

from core.exit_codes import CANNOT_CONTINUE, FAILED, HUNG, LOSS_SPIKE, PREEMPTED, USAGE, stopped_by

# The codes that say why the run stopped, most telling first: a hang or a spike explains the other ranks' ends
# (stopped by the reporter, or a collective that broke under them); a preemption explains nothing else.
_TELLING = (HUNG, LOSS_SPIKE, CANNOT_CONTINUE, USAGE, PREEMPTED)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was stopped by {signal.Signals(-code).name}"
        except ValueError:
            return f"was stopped by signal {-code}"
    return f"exited {code}"


def node_exit_code(codes: dict[int, int]) -> int:
    """The node's exit code from its ranks' ({global rank: exit code}, negative for a signal): a code of lmstack's
    own that says why (core/exit_codes.py) wins over a plain failure; a rank stopped by a signal alone gives the
    shell's 128 + signal."""
    failed = [c for c in codes.values() if c != 0]
    for code in _TELLING:
        if code in failed:
            return code
    positive = [c for c in failed if c > 0]
    if positive:
        return positive[0]
    return stopped_by(-failed[0]) if failed else FAILED


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        codes = {rank: failure.exitcode for rank, failure in sorted(e.failures.items())}
        code = node_exit_code(codes)
        ranks = ", ".join(f"rank {rank} {_describe(c)}" for rank, c in codes.items())
        print(f"[launch] {ranks}: exiting {code} (the ranks' own messages are above)", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
