"""`model.init_from` is checked against the run at load, before any work (issue 48 item 1): the family, the
weights, the tokenizer's vocabulary, the positions and the objective; each refusal names the key or file and both
values. The folders are made by transformers alone (tests/hf_folder.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runconfig import ConfigError, load_config
from tests.hf_folder import gpt2_folder

ROOT = Path(__file__).resolve().parents[2]
GPT2 = str(ROOT / "configs/gpt2-tiny.yaml")
ROBERTA = str(ROOT / "configs/roberta-tiny.yaml")
RUN = ["packing.seq_len=32", "model.size=tiny"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return gpt2_folder(tmp_path_factory.mktemp("hf") / "gpt2")


def test_architecture_and_tokenizer_come_from_the_folder(folder):
    cfg = load_config(GPT2, [*RUN, f"model.init_from={folder}"])
    m = cfg.model
    assert (m.hidden_size, m.num_layers, m.num_heads, m.ffn_size, m.max_position_embeddings) == (
        32,
        2,
        2,
        64,
        64,
    )
    assert m.init_from == str(folder)
    assert cfg.tokenizer.pretrained_path == str(folder)  # the run tokenizes with the folder's tokenizer
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert cfg.tokenizer.vocab_size == rows  # the folder's vocabulary sizes the plan's embedding


def test_another_family_is_refused(folder):
    with pytest.raises(
        ConfigError, match=r"model.init_from: .*model_type 'gpt2', but model.family is 'roberta'"
    ):
        load_config(ROBERTA, [*RUN, f"model.init_from={folder}"])


def test_a_folder_without_weights_is_refused(tmp_path):
    bare = gpt2_folder(tmp_path / "bare", weights=False)
    with pytest.raises(ConfigError, match=r"model.init_from: .*holds no weights \(none of model.safetensors"):
        load_config(GPT2, [*RUN, f"model.init_from={bare}"])
    with pytest.raises(ConfigError, match=r"model.init_from: .*config.json does not exist"):
        load_config(GPT2, [*RUN, f"model.init_from={tmp_path}"])


def test_a_tokenizer_the_vocabulary_disagrees_with_is_refused(folder, tmp_path):
    other = gpt2_folder(tmp_path / "other", vocab_size=300)  # another vocabulary, smaller than the folder's
    with pytest.raises(
        ConfigError, match=r"tokenizer.pretrained_path: .*\d+ tokens\) is not the one .*\d+ tokens"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={folder}", f"tokenizer.pretrained_path={other}"])
    no_tok = gpt2_folder(tmp_path / "no-tok", tokenizer=False)
    small = gpt2_folder(tmp_path / "small", vocab_size=300, tokenizer=False)  # fewer rows than the tokenizer
    with pytest.raises(
        ConfigError, match=r"tokenizer.pretrained_path: .*\d+ tokens, but .*vocab_size is \d+: ids past"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={small}", f"tokenizer.pretrained_path={folder}"])
    with pytest.raises(
        ConfigError, match=r"model.init_from: .*holds no tokenizer.*set tokenizer.pretrained_path"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={no_tok}"])
    ok = load_config(GPT2, [*RUN, f"model.init_from={no_tok}", f"tokenizer.pretrained_path={folder}"])
    assert ok.tokenizer.pretrained_path == str(folder)


def test_positions_and_objective_are_checked(folder, tmp_path):
    with pytest.raises(
        ConfigError, match=r"packing.seq_len: 128 exceeds the 64 positions of model.init_from"
    ):
        load_config(GPT2, ["packing.seq_len=128", f"model.init_from={folder}"])
    clf = gpt2_folder(tmp_path / "clf", head="GPT2ForSequenceClassification")
    with pytest.raises(
        ConfigError, match=r"objective.type: 'causal' trains GPT2LMHeadModel, .*GPT2ForSequence"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={clf}"])


# --- issue 64 item 5: init_from verifies the folder as adapt does, and the run's own tokenizer ----------------
def _cli(argv: list[str]) -> int:
    """`python -m pretrain <argv>` in this process: its exit code (a refused config exits through SystemExit)."""
    from pretrain.__main__ import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def _as_our_export(folder: Path, step: int = 4) -> Path:
    """`folder` marked as `pretrain export` marks it: training_state.json, then COMPLETE with the weights' hash."""
    from core.export_files import COMPLETE, weight_files, weights_hash

    (folder / "training_state.json").write_text(json.dumps({"step": step}))
    record = {"step": step, "weights_files": weight_files(folder), "weights_sha256": weights_hash(folder)}
    (folder / COMPLETE).write_text(json.dumps(record))
    return folder


def test_an_export_whose_weights_changed_since_export_is_refused_at_load(tmp_path):
    """Issue 64 item 5: one flipped bit in model.safetensors was accepted by init_from (rc 0, nothing said) while
    `adapt continue|transfer` refused the same folder. Both now run core/export_files.verify_export."""
    from pretrain.export.folder import ExportMismatchError, verify_export

    export = _as_our_export(gpt2_folder(tmp_path / "export"))
    load_config(GPT2, [*RUN, f"model.init_from={export}"])  # as written: accepted
    f = export / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-9] ^= 0x01  # one bit of the tensor data: the file still loads
    f.write_bytes(bytes(data))
    msg = r"differ from what `pretrain export` wrote at step 4"
    with pytest.raises(ExportMismatchError, match=msg):
        verify_export(export)  # adapt's refusal
    with pytest.raises(
        ConfigError, match=rf"model.init_from: {export}: its weights \(model.safetensors\) " + msg
    ):
        load_config(GPT2, [*RUN, f"model.init_from={export}"])


def test_a_truncated_safetensors_is_refused_at_load_and_plan_naming_the_file(tmp_path, capsys):
    """Issue 64 item 5: a truncated model.safetensors passed `plan`, then every rank crashed with a raw
    SafetensorError naming no file. It is refused at config load, in one line naming the file."""
    folder = gpt2_folder(tmp_path / "hf")
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    msg = (
        rf"model.init_from: {f}: damaged or truncated safetensors file \(\d+ bytes, but its header describes"
    )
    with pytest.raises(ConfigError, match=msg):
        load_config(GPT2, [*RUN, f"model.init_from={folder}"])
    capsys.readouterr()  # what building the folder printed
    rc = _cli(
        ["plan", "--config", GPT2, *RUN, f"model.init_from={folder}", f"run.output_dir={tmp_path / 'run'}"]
    )
    err = capsys.readouterr().err.strip()
    # the config error's own form: "error: invalid config <file>:" over one line per key
    assert rc != 0 and str(f) in err.splitlines()[-1] and "Traceback" not in err, err
    f.write_bytes(b"\x01")  # shorter than a header
    with pytest.raises(ConfigError, match=rf"{f}: damaged or truncated .*shorter than a safetensors header"):
        load_config(GPT2, [*RUN, f"model.init_from={folder}"])


def _permuted_tokenizer(src: Path, out: Path, n: int = 300) -> Path:
    """A copy of `src` whose tokenizer.json gives `n` tokens one another's ids (a rotation): same tokens, same
    size, other ids."""
    import shutil

    shutil.copytree(src, out)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)[-n:]  # merged tokens, not the byte alphabet or the special token
    ids = [vocab[t] for t in tokens]
    for t, i in zip(tokens, ids[1:] + ids[:1], strict=True):
        vocab[t] = i
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out


def test_a_tokenizer_whose_ids_differ_from_the_runs_tokenizer_is_refused(tmp_path, capsys):
    """Issue 64 item 5: init_from's tokenizer with 300 ids permuted against the run's tokenizer/ (the one tokens/
    were made with) was trained on without a word. `pretrain plan` and `pretrain train` refuse it before any
    rank starts, naming both folders and an id that differs."""
    from runconfig.init_from import check_run_tokenizer

    folder = gpt2_folder(tmp_path / "export")
    run = tmp_path / "run"
    import shutil

    shutil.copytree(folder, run / "tokenizer", ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    same = load_config(GPT2, [*RUN, f"model.init_from={folder}", f"run.output_dir={run}"])
    check_run_tokenizer(same)  # the run's tokenizer is the folder's: accepted
    permuted = _permuted_tokenizer(folder, tmp_path / "permuted")
    cfg = load_config(GPT2, [*RUN, f"model.init_from={permuted}", f"run.output_dir={run}"])
    msg = (
        rf"tokenizer.pretrained_path: '{permuted}' gives 300 of its \d+ tokens other ids than the run's "
        rf"tokenizer {run / 'tokenizer'}, which tokens/ were made with \(e.g. .+\)"
    )
    with pytest.raises(ConfigError, match=msg):
        check_run_tokenizer(cfg)
    capsys.readouterr()  # what building the folders printed
    for command in ("plan", "train"):
        rc = _cli([command, "--config", GPT2, *RUN, f"model.init_from={permuted}", f"run.output_dir={run}"])
        err = capsys.readouterr().err.strip()
        assert rc != 0 and len(err.splitlines()) == 1 and "other ids than the run's tokenizer" in err, err
