"""Issue 66: `[train] straggler` and `[spikes]` lines (logged warnings, on stderr) were glued to the progress bar
(`pretrain: 40%|####  | 4/10[spikes] rank 0: loss spike ...`): while a bar is shown, every console line goes
through tqdm.write, which clears the bar, prints the line on a line of its own and draws the bar again below."""

from __future__ import annotations

import sys

from tqdm import tqdm

from core.log import get_logger


def _visible_lines(text: str) -> list[str]:
    """What a terminal shows of each line: the text after its last carriage return."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_a_warning_while_the_bar_is_shown_gets_a_line_of_its_own(capsys):
    bar = tqdm(total=10, desc="pretrain", file=sys.stderr, mininterval=0, ascii=True)
    try:
        bar.update(4)
        get_logger("pretrain.run.spikes").warning("[spikes] rank 0: loss spike at step 4")
        get_logger("pretrain.run.watchdog").warning("[train] straggler at step 4: rank 1")
        get_logger("pretrain.run.train").info("[eval] step 4: loss 6.1")
        bar.update(1)
    finally:
        bar.close()
    out = capsys.readouterr()
    err_lines, out_lines = _visible_lines(out.err), _visible_lines(out.out)
    for needle in ("[spikes] rank 0", "[train] straggler"):
        (line,) = [x for x in err_lines if needle in x]
        assert line.startswith(needle), repr(line)
    assert any(x.startswith("[eval] step 4") for x in out_lines), out.out
    assert "5/10" in out.err  # the bar is drawn again after the lines


def test_without_a_bar_lines_are_written_as_before(capsys):
    get_logger("pretrain.run.spikes").warning("[spikes] plain")
    assert capsys.readouterr().err == "[spikes] plain\n"
