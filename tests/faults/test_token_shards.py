"""Issue 25 rows 1, 8 and 12 / item 2: token shards are verified against the manifest before training (size
always, sha256 by default; loader.verify_checksums=false keeps the size check only, for object stores that
checksum themselves), a token id outside the vocabulary is named with shard and offset at tokenize and at load
time, and a truncated .bin is one line naming the file and the cause. Every failure names the stage to rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.token_shards import MANIFEST, TokenShardError, TokenShardWriter, open_token_shards

VOCAB = 1000


def _tokens(tmp_path: Path, docs_per_shard=((5, 7, 3), (4, 9))) -> Path:
    """Two shards of one source written by the real writer, and the manifest `tokenize` writes over them."""
    out = tmp_path / "tokens"
    rng = np.random.default_rng(0)
    metas = []
    for i, lengths in enumerate(docs_per_shard):
        w = TokenShardWriter(out / "web" / f"shard-{i:05d}", np.dtype(np.uint16), vocab_size=VOCAB)
        for j, n in enumerate(lengths):
            w.add(f"d{i}-{j}", rng.integers(0, VOCAB, n))
        metas.append(w.close())
    manifest = {
        "complete": True,
        "sources": {"web": {"shards": metas}},
        "dtype": "uint16",
        "tokenizer": {"vocab_size": VOCAB, "sha256": "x"},
    }
    (out / MANIFEST).write_text(json.dumps(manifest))
    return out


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert "python -m data_pipeline tokenize" in msg, msg  # the stage to rerun
    return msg


def test_intact_shards_open(tmp_path):
    manifest, shards = open_token_shards(str(_tokens(tmp_path)))
    assert [s.num_tokens for s in shards["web"]] == [15, 13]


def test_bytes_changed_inside_a_bin_are_caught_by_sha256(tmp_path):
    out = _tokens(tmp_path)
    b = out / "web" / "shard-00001.bin"
    data = bytearray(b.read_bytes())
    data[4] ^= 0x01  # still a valid id: only the checksum can tell
    b.write_bytes(bytes(data))
    with pytest.raises(TokenShardError) as e:
        open_token_shards(str(out))
    msg = _one_line(e)
    assert str(b) in msg and "sha256" in msg
    # The size-only mode (object stores with their own checksums) does not hash, but still checks sizes.
    open_token_shards(str(out), checksums=False)


def test_one_bin_copied_over_another_is_caught(tmp_path):
    out = _tokens(tmp_path, ((5, 7, 3), (8, 7)))  # equal sizes: only the checksum tells them apart
    shutil.copyfile(out / "web" / "shard-00000.bin", out / "web" / "shard-00001.bin")
    with pytest.raises(TokenShardError) as e:
        open_token_shards(str(out))
    assert str(out / "web" / "shard-00001.bin") in _one_line(e)


@pytest.mark.parametrize("checksums", [True, False])
def test_truncated_bin_is_one_line_naming_file_and_cause(tmp_path, checksums):
    out = _tokens(tmp_path)
    b = out / "web" / "shard-00000.bin"
    b.write_bytes(b.read_bytes()[:-3])  # cut mid-token: numpy's "not a multiple of the data-type size"
    with pytest.raises(TokenShardError) as e:
        open_token_shards(str(out), checksums=checksums)
    msg = _one_line(e)
    assert str(b) in msg and "27 bytes" in msg and "30 bytes" in msg and "truncated" in msg


def test_token_id_outside_the_vocabulary_is_named_at_load(tmp_path):
    out = _tokens(tmp_path)
    b = out / "web" / "shard-00001.bin"
    ids = np.fromfile(b, np.uint16)
    ids[11] = VOCAB + 5
    ids.tofile(b)
    for checksums in (True, False):
        with pytest.raises(TokenShardError) as e:
            open_token_shards(str(out), checksums=checksums)
        msg = _one_line(e)
        assert str(b) in msg and f"token id {VOCAB + 5}" in msg and "offset 11" in msg and f"{VOCAB}" in msg


def test_token_id_outside_the_vocabulary_is_named_at_tokenize(tmp_path):
    w = TokenShardWriter(tmp_path / "web" / "shard-00003", np.dtype(np.uint16), vocab_size=VOCAB)
    w.add("a", np.arange(10))
    with pytest.raises(TokenShardError) as e:
        w.add("doc-7", np.array([1, 2, VOCAB, 3]))
    msg = str(e.value)
    assert "shard-00003" in msg and "doc-7" in msg and f"token id {VOCAB}" in msg and "offset 12" in msg
    w.abort()


def test_tokenize_rerun_rewrites_a_damaged_shard_and_training_data_opens_again(tmp_path):
    """What the error tells the user to do works: the tokenize stage redoes a shard that fails the check."""
    from core.run_layout import RunLayout
    from data_pipeline.tokenize import run_tokenize
    from tests.data_pipeline.tokens_fixtures import tokenized_run

    run = tokenized_run(tmp_path, limit=120, per_shard=60)
    tokens = RunLayout(run).tokens
    b = tokens / "bbc" / "shard-00001.bin"
    good = b.read_bytes()
    b.write_bytes(good[:10] + bytes([good[10] ^ 1]) + good[11:])
    with pytest.raises(TokenShardError, match="sha256"):
        open_token_shards(str(tokens))
    r = run_tokenize(run)
    assert r["shards_written"] == 1 and r["shards_reused"] == 1
    assert b.read_bytes() == good
    open_token_shards(str(tokens))
