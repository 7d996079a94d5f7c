"""Our byte-level BPE encoding path, loaded with real reference vocabularies, reproduces their ids exactly.

(b) GPT-2's ranks from the openai-whisper sdist (whisper/assets/gpt2.tiktoken): merges are derived from the ranks
    the way tiktoken's own BPE would form each token, then checked on known GPT-2 ids and against tiktoken built
    on the same ranks, over real BBC text.
(a) llama.cpp's vocab-only GGUF for GPT-2 (shipped in the llama-cpp-python sdist) with its expected ids
    (.gguf.inp/.gguf.out), read with the `gguf` package. The sdist is 75 MB, so that test is `integration`.
Both sdists are fetched with `pip download` into .cache/ once; no network -> skipped with the reason.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from data_pipeline.tokenizers import bpe_tokenizer
from data_pipeline.tokenizers.fast_bpe import merges_from_ranks
from tests.data_pipeline.tokens_fixtures import ROOT, bbc_docs

CACHE = ROOT / ".cache" / "reference-vocab"
WHISPER = ("openai-whisper", "20250625", "whisper/assets/gpt2.tiktoken")
LLAMA = ("llama-cpp-python", "0.3.36", "vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf")
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def sdist_members(pkg: str, version: str, members: list[str]) -> list[Path]:
    """Extract members of a PyPI sdist into .cache/ (downloaded once with pip; skip if the registry is unreachable)."""
    dest = CACHE / f"{pkg}-{version}"
    outs = [dest / m for m in members]
    if all(p.is_file() for p in outs):
        return outs
    dl = CACHE / "sdists"
    dl.mkdir(parents=True, exist_ok=True)
    found = sorted(dl.glob(f"{pkg.replace('-', '_')}-{version}.tar.gz"))
    if not found:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{pkg}=={version}",
                "-d",
                str(dl),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        found = sorted(dl.glob(f"{pkg.replace('-', '_')}-{version}.tar.gz"))
        if r.returncode or not found:
            pytest.skip(f"cannot download the {pkg}=={version} sdist from PyPI: {r.stderr.strip()[-300:]}")
    with tarfile.open(found[0]) as tf:
        root = tf.getnames()[0].split("/")[0]
        for m, out in zip(members, outs, strict=True):
            out.parent.mkdir(parents=True, exist_ok=True)
            fh = tf.extractfile(f"{root}/{m}")
            assert fh is not None, f"{m} missing from {found[0].name}"
            out.write_bytes(fh.read())
    if found[0].stat().st_size > 20_000_000:
        found[0].unlink()  # keep only the few files we need from big sdists
    return outs


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the alphabet of byte-level BPE vocabularies)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


@pytest.fixture(scope="module")
def gpt2_from_whisper():
    (path,) = sdist_members(*WHISPER[:2], [WHISPER[2]])
    ranks = {
        base64.b64decode(tok): int(r)
        for tok, r in (line.split() for line in path.read_text().splitlines() if line)
    }
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    vocab = {enc(t): r for t, r in ranks.items()}
    derived = merges_from_ranks(ranks)
    assert derived is not None, "some GPT-2 token is not reachable by a single merge"
    merges = [(enc(a), enc(b)) for a, b in derived]
    return ranks, bpe_tokenizer(vocab, merges)


def test_gpt2_ranks_known_ids(gpt2_from_whisper):
    ranks, tok = gpt2_from_whisper
    assert len(ranks) == 50256
    # ids published with GPT-2 (and asserted by tiktoken's own tests)
    assert tok.encode("hello world").ids == [31373, 995]
    assert tok.encode("Hello world").ids == [15496, 995]
    assert tok.encode(" Hello World!").ids == [18435, 2159, 0]


def test_gpt2_ranks_match_tiktoken_on_real_text(gpt2_from_whisper):
    tiktoken = pytest.importorskip("tiktoken")
    ranks, tok = gpt2_from_whisper
    ref = tiktoken.Encoding("gpt2-local", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={})
    texts = [d["text"] for d in bbc_docs(limit=150)]
    texts += ["naïve café — 日本語 😀 \t\n\n  x", "   leading spaces", "'s 've 're don't I'M"]
    ours = [e.ids for e in tok.encode_batch(texts)]
    assert ours == [ref.encode_ordinary(t) for t in texts]
    assert sum(map(len, ours)) > 50_000  # a real amount of text was compared


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_gguf_gpt2_vocab_reproduces_llama_cpp_expected_ids():
    gguf = pytest.importorskip("gguf")
    model, inp, out = sdist_members(*LLAMA[:2], [LLAMA[2], LLAMA[2] + ".inp", LLAMA[2] + ".out"])
    r = gguf.GGUFReader(str(model))

    def strings(key: str) -> list[str]:
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    assert strings("tokenizer.ggml.model") == ["gpt2"]
    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tok = bpe_tokenizer({t: i for i, t in enumerate(tokens)}, merges)
    cases = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = out.read_text(encoding="utf-8").split("\n")
    cases = cases[: len(expected)] if cases[-1] == "" else cases
    assert len(cases) >= 40
    for text, line in zip(cases, expected, strict=False):
        assert tok.encode(text).ids == [int(x) for x in line.split()], repr(text)
