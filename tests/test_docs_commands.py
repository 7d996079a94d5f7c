"""Every shell command in a fenced block of README.md, CONTRIBUTING.md and docs/*.md runs as written.

A command is run in the form that does no lasting work: `launch run` and `launch pipeline-slurm` with
`--dry-run`, `launch sbatch --print` as written (it only writes the script), `pretrain plan` as written, a data stage
for real on the demo's packaged data. Commands that cannot run here are skipped with a named reason (`make demo`,
`make test*`: minutes of work that CI runs anyway; a Slurm submission; a placeholder such as `<job id>`). A command
no rule covers fails this test, so a new command in the docs needs a rule here.

Commands run in a scratch folder that holds a link to `configs/` and every file the docs show as "`name`:" followed
by a fenced block (the hostfile), so their outputs (`runs/...`) never land in the checkout. Before any process is
started, every command's `--config` and overrides are loaded with the real loader: an unknown key in the docs (the
old `clean.workers=4`) fails the fast tier in a second.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from runconfig import load_config

pytestmark = pytest.mark.timeout(60)  # a dry run takes about a second; the slow commands set their own

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
NAMED_FILE = re.compile(r"^`([\w.-]+)`:\s*\n\s*\n```\w*\n(.*?)^```", re.M | re.S)

# make targets: what they do takes minutes and is run by CI (`.ci/run`) or by hand, never from a test.
MAKE_SKIPS = {
    "demo": "make demo: the whole demo (install + about 6-10 minutes of pipeline); run by hand and in CI",
    "test": "make test: the fast test tier, which this test is part of",
    "test-all": "make test-all: every test tier (CI runs it)",
    "test-unit": "make test-unit: a test tier, which this test is part of",
    "test-integration": "make test-integration: a test tier, which this test is part of",
    "lint": "make lint: the linters, run by CI",
    "bench": "make bench: every benchmark script, about 40 minutes",
    "bench-all": "make bench-all: every benchmark script with the long studies",
}


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str  # the command as written, continuation lines joined

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)


@dataclass(frozen=True)
class Plan:
    skip: str | None = None  # the reason, when the command is not run
    argv: tuple[str, ...] = ()  # what runs (python replaced by this interpreter)
    slow: bool = False  # more than a few seconds: integration tier


def doc_commands() -> list[DocCommand]:
    """Each command line of each fenced shell block (a trailing backslash joins the next line); a command shown in
    several places is checked once, under its first place."""
    out: list[DocCommand] = []
    seen: set[str] = set()
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) not in SHELL_LANGS:
                continue
            first_line = text.count("\n", 0, m.start(2)) + 1
            pending, start = "", first_line
            for offset, line in enumerate(m.group(2).splitlines()):
                if not pending:
                    start = first_line + offset
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                cmd = (pending + line).strip()
                pending = ""
                if cmd and shlex.split(cmd, comments=True) and cmd not in seen:
                    seen.add(cmd)
                    out.append(DocCommand(f"{path.relative_to(ROOT)}:{start}", cmd))
    return out


def named_files() -> dict[str, str]:
    """Files the docs show by name ("`hosts`:" then a fenced block): the commands after them read them."""
    files: dict[str, str] = {}
    for path in DOC_FILES:
        for m in NAMED_FILE.finditer(path.read_text(encoding="utf-8")):
            files[m.group(1)] = m.group(2)
    return files


def _python(argv: list[str]) -> list[str]:
    return [sys.executable, *argv[1:]]


def plan(cmd: DocCommand) -> Plan:
    """How a documented command is checked: run in its dry-run/plan form, run for real, or skipped with a reason."""
    argv = cmd.argv
    placeholder = re.search(r"<[^<>]+>", cmd.text)
    if placeholder:
        return Plan(skip=f"needs a value the reader supplies: {placeholder.group(0)}")
    if argv[0] == "make":
        target = argv[1] if len(argv) > 1 else "demo"
        if target not in MAKE_SKIPS:
            raise AssertionError(f"{cmd.where}: no rule for `make {target}`; add one to {__name__}")
        return Plan(skip=MAKE_SKIPS[target])
    if argv[0] in ("pip", "pip3") or argv[1:3] == ["-m", "pip"]:
        return Plan(skip="installs packages")
    if argv[0].endswith("python") and argv[1:3] == ["-m", "pytest"]:
        return Plan(skip="runs tests (this test is one of them)")
    if argv[0] != "python" or len(argv) < 4 or argv[1] != "-m":
        raise AssertionError(f"{cmd.where}: no rule for `{cmd.text}`; add one to {__name__}")
    module, sub = argv[2], argv[3]
    if module == "launch" and sub in ("run", "pipeline-slurm"):
        return Plan(argv=tuple(_python(argv) + ([] if "--dry-run" in argv else ["--dry-run"])))
    if module == "launch" and sub == "sbatch":
        if "--submit" in argv:
            return Plan(skip="submits to a Slurm cluster (the same command with --print is run)")
        return Plan(argv=tuple(_python(argv)))
    if module == "pretrain" and sub == "plan":
        return Plan(argv=tuple(_python(argv)), slow=True)  # imports torch, DeepSpeed and transformers
    if module == "data_pipeline" and sub == "clean":
        # cleans the demo's packaged crawl and corpus for real
        return Plan(argv=tuple(_python(argv)), slow=True)
    raise AssertionError(f"{cmd.where}: no rule for `{cmd.text}`; add one to {__name__}")


def _config_and_overrides(argv: list[str]) -> tuple[str, list[str]] | None:
    if "--config" not in argv:
        return None
    config = argv[argv.index("--config") + 1]
    overrides = [a for a in argv[4:] if "=" in a and not a.startswith("-")]
    return config, overrides


COMMANDS = doc_commands()


def test_docs_have_commands_and_every_one_has_a_rule():
    """The extraction finds the commands the README shows, and each command maps to a run or a named skip."""
    texts = [c.text for c in COMMANDS]
    assert any(t.startswith("make demo") for t in texts) and any(
        t.startswith("python -m launch run") for t in texts
    )
    for cmd in COMMANDS:
        p = plan(cmd)
        assert p.skip or p.argv, cmd.where


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _config_and_overrides(c.argv)], ids=lambda c: c.where)
def test_documented_config_and_overrides_load(cmd: DocCommand):
    """Every `--config` file and `key=value` override in the docs is accepted by the real loader."""
    config, overrides = _config_and_overrides(cmd.argv)
    load_config(ROOT / config, overrides)


def _run(cmd: DocCommand, p: Plan, tmp_path: Path) -> None:
    if p.skip:
        pytest.skip(p.skip)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for name, content in named_files().items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(list(p.argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (
        f"{cmd.where}: `{cmd.text}` exited {out.returncode} as run ({shlex.join(p.argv[1:])}):\n"
        f"{out.stderr[-3000:]}\n{out.stdout[-2000:]}"
    )
    assert out.stdout.strip(), f"{cmd.where}: `{cmd.text}` printed nothing"


def _slow(cmd: DocCommand) -> bool:
    try:
        return plan(cmd).slow
    except AssertionError:
        return False  # no rule: reported by the fast test of this command, not at collection


FAST = [c for c in COMMANDS if not _slow(c)]
SLOW = [c for c in COMMANDS if _slow(c)]


@pytest.mark.parametrize("cmd", FAST, ids=[c.where for c in FAST])
def test_documented_command_runs(cmd: DocCommand, tmp_path: Path):
    """Dry runs and script rendering: about a second each."""
    _run(cmd, plan(cmd), tmp_path)


@pytest.mark.integration
@pytest.mark.timeout(600)  # 40-60 s each when idle; several times that with the suite beside it
@pytest.mark.parametrize("cmd", SLOW, ids=[c.where for c in SLOW])
def test_documented_slow_command_runs(cmd: DocCommand, tmp_path: Path):
    """Commands that import the training stack or clean real data: 40-60 s each on 2 cores."""
    _run(cmd, plan(cmd), tmp_path)


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    """Every relative link in the README and docs names a file of the checkout (pages moved into docs/ stay found)."""
    targets = [m.group(1) for m in LINK.finditer(doc.read_text(encoding="utf-8"))]
    broken = [t for t in targets if "://" not in t and not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files: {broken}"


CODE_SPAN = re.compile(r"`([^`\s]+)`")
REPO_DIRS = (
    "core/",
    "runconfig/",
    "data_pipeline/",
    "pretrain/",
    "adapt/",
    "launch/",
    "configs/",
    "bench/",
    "tests/",
    "docs/",
    ".ci/",
)
OUTSIDE = re.compile(r"^(/(work|home|root|Users|mnt|srv)/|\.\./)")


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_files_in_the_repository(doc: Path):
    """A file the docs name in `code` is one of the checkout's (placeholders such as <run> aside), and no page points
    at a path outside the repository, which a reader of a clone does not have."""
    spans = [m.group(1) for m in CODE_SPAN.finditer(doc.read_text(encoding="utf-8"))]
    paths = [s.split(":")[0].rstrip(".,;)") for s in spans]
    missing = [
        p
        for p in paths
        if p.startswith(REPO_DIRS) and not any(c in p for c in "<{*$") and not (ROOT / p).exists()
    ]
    outside = [p for p in paths if OUTSIDE.match(p)]
    assert not missing and not outside, (
        f"{doc.relative_to(ROOT)}: missing {missing}, outside the repository {outside}"
    )
