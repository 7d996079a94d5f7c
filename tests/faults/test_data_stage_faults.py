"""The fault matrix's data stages (issue 25, items 1-2): clean, dedup, train-tokenizer and tokenize against
SIGKILL / SIGINT / SIGTERM while they write, and against a damaged output of the previous stage.

A stage killed or stopped while it writes, then run again, ends with the same bytes as an uninterrupted run
(shards, markers, manifests, tokenizer files; timing fields aside) and leaves no temporary file. SIGINT and
SIGTERM stop it with the conventional exit code (130 / 143) and one line on stderr, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.exit_codes import CANNOT_CONTINUE
from data_pipeline.clean import run_clean
from data_pipeline.dedup import run_dedup
from data_pipeline.shards import ShardMismatchError, verify_shards
from data_pipeline.tokenize import run_tokenize
from data_pipeline.tokenizers import train_tokenizer
from runconfig import load_config
from tests.data_pipeline.test_bad_input import bbc_texts

ROOT = Path(__file__).resolve().parents[2]
# one worker runs the module: its tests have different timeouts, and handed out one by one they met the reference
# runs (a module fixture) three times
pytestmark = pytest.mark.xdist_group("data-stage-faults")
STAGE_ORDER = ("clean", "dedup", "train-tokenizer", "tokenize")
OUTPUT = {"clean": "clean", "dedup": "dedup", "train-tokenizer": "tokenizer", "tokenize": "tokens"}
# What appears once a stage writes (temporary files included: pathlib's glob matches hidden names).
WRITING = {
    "clean": "clean/*/*",
    "dedup": "dedup/_work/*/*/*",
    "train-tokenizer": ".tokenizer.*",
    "tokenize": "tokens/*/*",
}
VOLATILE = {"seconds", "where"}  # wall time and host name in markers: the only fields allowed to differ
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def _cli(stage: str, yaml: Path) -> list[str]:
    return [sys.executable, "-m", "data_pipeline", stage, "--config", str(yaml)]


def _run(stage: str, yaml: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(_cli(stage, yaml), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{stage}: exit {res.returncode}\n{res.stderr[-3000:]}"
    return res


def write_corpus(tmp: Path, business: int = 30, sports: int = 10, per_shard: int = 5) -> Path:
    """BBC articles (4 exact copies for dedup to remove) as a text folder; a few documents a cleaned shard, so
    every stage has several shards or tasks to be stopped between; a vocabulary of 600."""
    news = tmp / "texts" / "news"
    news.mkdir(parents=True)
    texts = bbc_texts(business) + bbc_texts(sports, "sports")
    for i, text in enumerate(texts + texts[:4]):
        (news / f"{i:03d}.txt").write_text(text)
    clean = {
        "docs_per_shard": per_shard,
        "progress": False,
        "c4": {"enabled": False},
        "gopher_quality": {"enabled": False},
        "gopher_repetition": {"enabled": False},
        "langid": {"enabled": False},
    }
    yaml = tmp / "run.yaml"
    yaml.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(tmp / "out")},
                "data": {
                    "sources": [{"name": "news", "format": "text_folder", "paths": [str(tmp / "texts")]}],
                    "clean": clean,
                },
                "tokenizer": {"vocab_size": 600},
            }
        )
    )
    return yaml


def _scrub(x):
    if isinstance(x, dict):
        return {k: _scrub(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_scrub(v) for v in x]
    return x


def contents(folder: Path) -> dict[str, object]:
    """Every file under `folder` (hidden ones too): JSON files parsed without their timing fields, the rest as
    bytes."""
    out: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.suffix in (".json", ".done"):
                try:
                    out[p.relative_to(folder).as_posix()] = _scrub(json.loads(data))
                    continue
                except ValueError:
                    pass
            out[p.relative_to(folder).as_posix()] = data
    return out


def leftovers(out: Path) -> list[str]:
    """Temporary files and folders anywhere in the run folder (atomic writes' `.<name>.*.tmp`, token shards'
    `.<stem>.bin.tmp<pid>`, the tokenizer's `.tokenizer.*` staging folder, `replace_dir`'s `<folder>.old`)."""
    return sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.name.startswith(".") or ".tmp" in p.name or p.name.endswith(".old")
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """The run YAML and, per stage, a copy of the run folder after the uninterrupted stage (mtimes kept: the
    later stages' completion records hold their inputs' mtimes)."""
    tmp = tmp_path_factory.mktemp("stages")
    yaml = write_corpus(tmp)
    out = tmp / "out"
    snaps = {"": tmp / "snap-start"}
    snaps[""].mkdir()
    for stage in STAGE_ORDER:
        _run(stage, yaml)
        snaps[stage] = tmp / f"snap-{stage}"
        shutil.copytree(out, snaps[stage])
    return yaml, snaps


def inputs_of(snaps: dict[str, Path], stage: str) -> Path:
    """The snapshot a stage starts from: the previous stage's outputs (the corpus alone for clean)."""
    return snaps[STAGE_ORDER[STAGE_ORDER.index(stage) - 1]] if stage != "clean" else snaps[""]


def restore(snap: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(snap, out)


def interrupt_while_writing(
    stage: str, yaml: Path, out: Path, sig: signal.Signals, before: Path, attempts: int = 5
) -> tuple[int, str]:
    """Start the stage (on `before`'s outputs) in its own process group, send `sig` to the group (as a terminal's
    Ctrl-C or a scheduler does) as soon as it writes, and return its exit status and stderr. train-tokenizer's
    writing (one staged folder) lasts milliseconds and can end between two looks on a loaded machine (CI): then
    the outputs are put back and the stage started again, up to `attempts` times."""
    for _ in range(attempts):
        restore(before, out)
        p = subprocess.Popen(
            _cli(stage, yaml),
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            while p.poll() is None and not any(out.glob(WRITING[stage])):
                time.sleep(0.002)
            if p.poll() is not None:
                p.communicate()
                continue  # finished before the signal could be sent: nothing was tested yet
            os.killpg(p.pid, sig)
            _, err = p.communicate(timeout=120)
            return p.returncode, err
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    pytest.fail(
        f"{stage} finished before the signal could be sent in {attempts} attempts: nothing was tested"
    )


CASES = [
    (stage, sig)
    for stage in STAGE_ORDER
    for sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM)
    if (stage, sig) != ("clean", signal.SIGKILL)  # clean x SIGKILL: tests/data_pipeline/test_empty_stage.py
]


@pytest.mark.integration
@pytest.mark.timeout(420)  # the module's reference runs (4 stage processes) count in the first test's time
@pytest.mark.parametrize(("stage", "sig"), CASES, ids=[f"{s}-{g.name}" for s, g in CASES])
def test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes(pipeline, stage, sig):
    yaml, snaps = pipeline
    out = yaml.parent / "out"
    before = inputs_of(snaps, stage)
    rc, err = interrupt_while_writing(stage, yaml, out, sig, before)
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL, (rc, err[-2000:])
    else:
        assert rc == CODE[sig], (rc, err[-2000:])
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: {stage}: stopped by {sig.name}"), err[-2000:]
        assert "rerun" in last, last
    _run(stage, yaml)
    assert leftovers(out) == []
    want = contents(snaps[stage] / OUTPUT[stage])
    have = contents(out / OUTPUT[stage])
    assert sorted(have) == sorted(want)
    assert [k for k in want if have[k] != want[k]] == []


# -------------------------------------------------------------------- damaged output of the previous stage
DAMAGES = ("truncated", "bytes changed", "copied over")


def damage(path: Path, how: str, other: Path) -> bytes:
    """Damage a shard as a disk, a copy or a user would; returns its good bytes."""
    good = path.read_bytes()
    if how == "truncated":
        path.write_bytes(good[:-7])
    elif how == "bytes changed":  # same size: only the checksum can tell
        data = bytearray(good)
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        shutil.copyfile(other, path)
    return good


def _tiny(tmp: Path, *overrides: str):
    """12 articles (+2 copies), 4 a shard, every stage in this process (one worker): a fast-tier run."""
    write_corpus(tmp, business=8, sports=4, per_shard=4)
    return _tiny_cfg(tmp, *overrides)


def _tiny_cfg(tmp: Path, *overrides: str):
    return load_config(tmp / "run.yaml", ["data.clean.workers=1", "shards.workers=1", *overrides])


def _refused(fn, cfg, shard: Path, stage: str, other: Path) -> None:
    """Each damage stops `fn` before any work, in one line naming the shard and the stage to rerun."""
    for how in DAMAGES:
        good = damage(shard, how, other)
        with pytest.raises(ShardMismatchError) as e:
            fn(cfg)
        msg = str(e.value)
        assert "\n" not in msg and str(shard) in msg, msg
        assert f"rerun `python -m data_pipeline {stage}`" in msg, msg
        shard.write_bytes(good)


@pytest.mark.timeout(60)
def test_dedup_refuses_a_damaged_cleaned_shard_and_clean_rewrites_it(tmp_path):
    cfg = _tiny(tmp_path)
    run_clean(cfg)
    shards = sorted((tmp_path / "out/clean/news").glob("shard-*.jsonl.zst"))
    _refused(run_dedup, cfg, shards[1], "clean", shards[0])
    assert not (tmp_path / "out/dedup").exists()  # refused before any work
    good = damage(shards[1], "copied over", shards[0])
    assert run_clean(cfg)["shards_run"] == 1  # what the message says to do works: the damaged shard is redone
    assert shards[1].read_bytes() == good
    kept = json.loads((tmp_path / "out/clean/stats.json").read_text())["totals"]["kept"]
    assert run_dedup(cfg)["docs_in"] == kept


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", ["train-tokenizer", "tokenize"])
def test_tokenizer_and_tokenize_refuse_a_damaged_deduplicated_shard(tmp_path, reader):
    cfg = _tiny(tmp_path)
    run_clean(cfg)
    run_dedup(cfg)
    if reader == "tokenize":
        train_tokenizer(cfg)
    fn = train_tokenizer if reader == "train-tokenizer" else run_tokenize
    shards = sorted((tmp_path / "out/dedup/news").glob("shard-*.jsonl.zst"))
    _refused(fn, cfg, shards[2], "dedup", shards[0])
    assert not (tmp_path / "out" / ("tokenizer" if reader == "train-tokenizer" else "tokens")).exists()
    good = damage(shards[2], "copied over", shards[0])
    assert run_dedup(cfg)["tasks_run"]["dedup-filter"] == 1  # dedup rewrites the shard that fails the check
    assert shards[2].read_bytes() == good
    fn(cfg)


def test_size_is_always_checked_and_sha256_unless_switched_off(tmp_path):
    """data.verify_checksums=false (an object store that checksums itself): a same-size change passes, a cut
    shard is still refused."""
    cfg = _tiny(tmp_path, "data.verify_checksums=false")
    run_clean(cfg)
    a, b = sorted((tmp_path / "out/clean/news").glob("shard-*.jsonl.zst"))[:2]
    damage(a, "bytes changed", b)
    verify_shards([a], "clean", "dedup", checksums=False)
    with pytest.raises(ShardMismatchError, match="sha256"):
        verify_shards([a], "clean", "dedup", checksums=True)
    damage(b, "truncated", a)
    with pytest.raises(ShardMismatchError, match="truncated"):
        verify_shards([b], "clean", "dedup", checksums=False)


# -------------------------------------------------------------------------------- changed setting on rerun
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_changed_settings_on_rerun_redo_what_they_affect(tmp_path):
    """clean: a changed filter setting redoes the shards it applies to, naming the key; dedup: a changed setting
    (or changed cleaned input) redoes every task in a new work folder; train-tokenizer always trains again, and a
    tokenizer whose bytes changed (here a new vocabulary size) makes tokenize rewrite every shard."""
    cfg = _tiny(tmp_path)
    run_clean(cfg)
    run_dedup(cfg)
    train_tokenizer(cfg)
    run_tokenize(cfg)
    n = len(list((tmp_path / "out/clean/news").glob("shard-*.jsonl.zst")))
    assert (
        run_clean(cfg)["shards_run"] == 0 and run_tokenize(cfg)["shards_written"] == 0
    )  # unchanged: all kept

    changed = _tiny_cfg(tmp_path, "data.clean.min_chars=50")
    r = run_clean(changed)
    assert r["shards_run"] == n and r["shards_redone"] == {"news: settings changed: min_chars": n}
    assert run_dedup(changed)["tasks_run"]["dedup-signatures"] == n  # its inputs were rewritten
    fewer = _tiny_cfg(tmp_path, "data.clean.min_chars=50", "data.dedup.exact=false")
    assert run_dedup(fewer)["tasks_run"]["dedup-signatures"] == n  # a dedup setting: a new work folder

    bigger = _tiny_cfg(
        tmp_path, "data.clean.min_chars=50", "data.dedup.exact=false", "tokenizer.vocab_size=700"
    )
    train_tokenizer(bigger)
    meta = json.loads((tmp_path / "out/tokenizer/training_meta.json").read_text())
    assert meta["requested_vocab_size"] == 700
    t = run_tokenize(bigger)
    assert t["shards_reused"] == 0 and t["shards_written"] == len(
        list((tmp_path / "out/dedup/news").glob("*.zst"))
    )


# ---------------------------------------------------------------------------------------------- full disk
DONE = {  # what says a stage finished: absent (or not complete) after a full disk
    "clean": "clean/stats.json",
    "dedup": "dedup/_DONE.json",
    "train-tokenizer": "tokenizer/tokenizer.json",
    "tokenize": "tokens/manifest.json",
}


NEEDS_ROOT_MOUNT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="needs root to mount a small tmpfs as a full disk",
)


@contextlib.contextmanager
def _full_disk(pipeline, stage: str):
    """The run folder on a 16 MiB tmpfs holding the previous stage's outputs, filled up to 8 KiB free; yields the
    folder and the filler file (unlink it to give the space back)."""
    yaml, snaps = pipeline
    out = yaml.parent / "out"
    before = inputs_of(snaps, stage)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(out)], check=True)
    try:
        shutil.copytree(before, out, dirs_exist_ok=True)
        filler = out / "filler"
        filler.write_bytes(b"\0" * (shutil.disk_usage(out).free - (8 << 10)))
        yield out, filler
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


def _refused_for_space(res: subprocess.CompletedProcess, stage: str, out: Path) -> None:
    """One line naming the folder and its free space, exit 65, and no shard that is partial yet marked done."""
    assert res.returncode == CANNOT_CONTINUE, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {stage}: the disk is full under {out}") and "MiB free" in last, last
    marked = [
        p for p in out.rglob("shard-*.jsonl.zst") if (p.parent / (p.name.split(".")[0] + ".done")).exists()
    ]
    verify_shards(marked, stage, "test")  # nothing partial carries a completion marker


@pytest.mark.integration
@pytest.mark.timeout(420)  # the module's reference runs count in the first test's time
@NEEDS_ROOT_MOUNT
@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_full_disk_is_named_and_nothing_partial_is_kept_as_done(pipeline, stage):
    """A full disk before the stage: one line naming the folder and its free space (exit 65), the stage is not
    marked done; with space again the rerun ends with the same bytes as an uninterrupted run."""
    yaml, snaps = pipeline
    with _full_disk(pipeline, stage) as (out, filler):
        res = subprocess.run(
            _cli(stage, yaml), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
        )
        _refused_for_space(res, stage, out)
        done = out / DONE[stage]
        assert not done.exists() or not json.loads(done.read_text()).get("complete", True), done
        filler.unlink()
        _run(stage, yaml)
        assert leftovers(out) == []
        want, have = contents(snaps[stage] / OUTPUT[stage]), contents(out / OUTPUT[stage])
        assert sorted(have) == sorted(want) and [k for k in want if have[k] != want[k]] == []


@pytest.mark.timeout(300)
@NEEDS_ROOT_MOUNT
@pytest.mark.parametrize("stage", ["clean", "tokenize"])
def test_full_disk_in_one_array_task_is_named(pipeline, stage):
    """One Slurm array task (`--shard-index`) on a full disk: the same one line and exit 65 as a whole stage (a
    code the Slurm scripts do not requeue on), no shard of it marked done; with space again it completes."""
    yaml, _ = pipeline
    with _full_disk(pipeline, stage) as (out, filler):
        cmd = [*_cli(stage, yaml), "--shard-index", "0"]
        res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        _refused_for_space(res, stage, out)
        filler.unlink()
        res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        assert leftovers(out) == []
