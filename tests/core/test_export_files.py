"""core/export_files.py: the one check of an export's weights that `model.init_from` (at config load) and `adapt`
(before any work) both run. Only the files the export's COMPLETE lists are its weights (issue 64 item 10: an
adapter saved into a subfolder made the export "damaged"); a safetensors file cut short is named by its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.export_files import (
    COMPLETE,
    ExportMismatchError,
    NotAModelFolderError,
    check_weight_files,
    verify_export,
    weight_files,
    weights_hash,
)


def _safetensors(path: Path, payload: bytes = b"\x00" * 16) -> Path:
    """A well-formed safetensors file of one uint8 tensor (the format's framing, written by hand)."""
    header = json.dumps(
        {"w": {"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]}}
    ).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(header).to_bytes(8, "little") + header + payload)
    return path


def _config(folder: Path) -> Path:
    """A config.json (what makes a folder a model folder; its content is not read here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


def _export(folder: Path) -> Path:
    _safetensors(_config(folder) / "model.safetensors")
    (folder / "training_state.json").write_text(json.dumps({"step": 3}))
    record = {"step": 3, "weights_files": weight_files(folder), "weights_sha256": weights_hash(folder)}
    (folder / COMPLETE).write_text(json.dumps(record))
    return folder


def test_an_adapter_saved_below_the_export_leaves_it_verified(tmp_path):
    export = _export(tmp_path / "export")
    _safetensors(export / "lora" / "adapter_model.safetensors", b"\x01" * 8)  # saved there after the export
    verify_export(export)
    assert weight_files(export) == ["model.safetensors"]
    _safetensors(export / "model.safetensors", b"\x02" * 16)  # the export's own weights changed: refused
    with pytest.raises(ExportMismatchError, match=r"its weights \(model.safetensors\) differ from what"):
        verify_export(export)


def test_an_export_written_before_complete_listed_its_files_still_verifies(tmp_path):
    export = _config(tmp_path / "old")
    _safetensors(export / "model.safetensors")
    (export / "training_state.json").write_text("{}")
    everything = weights_hash(export, ["model.safetensors"])
    (export / COMPLETE).write_text(json.dumps({"step": 1, "weights_sha256": everything}))
    verify_export(export)
    (export / COMPLETE).write_text("not json")
    with pytest.raises(ExportMismatchError, match=rf"{export / COMPLETE}: not the JSON record"):
        verify_export(export)


def test_a_truncated_or_missing_shard_is_named(tmp_path):
    folder = _config(tmp_path / "hf")
    shard = _safetensors(folder / "model-00001-of-00002.safetensors")
    _safetensors(folder / "model-00002-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": shard.name, "b": "model-00002-of-00002.safetensors"}})
    )
    check_weight_files(folder)
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(
        ExportMismatchError, match=rf"{shard}: damaged or truncated safetensors file \(\d+ bytes"
    ):
        verify_export(folder)
    shard.unlink()
    with pytest.raises(ExportMismatchError, match=rf"{shard}: missing"):
        check_weight_files(folder)
    (folder / "config.json").unlink()
    with pytest.raises(
        NotAModelFolderError, match=rf"{folder}: no model here \(no config.json; .*downloads nothing"
    ):
        verify_export(folder)
