"""`objective.chunked_loss` (pretrain/objectives/losses.py): the chunked linear + cross-entropy gives transformers' loss and
gradients, never creates a tensor as large as the [tokens, vocab] logits, and is refused at load where it cannot
apply, naming the key."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pretrain.objectives import losses, prepare_model
from pretrain.run.models import build_model
from pretrain.tools.plan import _VocabOnly
from runconfig import ConfigError, load_config

pytestmark = pytest.mark.timeout(120)


class _LargestTensor(TorchDispatchMode):
    """The element count of the largest tensor any op produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _pair(family: str, overrides: list[str] | None = None):
    """The same tiny model twice (same weights): one with HF's full-logits loss, one with the chunked loss."""
    cfg = load_config(
        f"configs/{family}-tiny.yaml", ["model.dropout=0", "model.attention_dropout=0", *(overrides or [])]
    )
    chunked_cfg = load_config(
        f"configs/{family}-tiny.yaml",
        ["model.dropout=0", "model.attention_dropout=0", "objective.chunked_loss=true", *(overrides or [])],
    )
    torch.manual_seed(0)
    full = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    prepare_model(cfg, full)
    chunked = build_model(chunked_cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    chunked.load_state_dict(full.state_dict())
    prepare_model(chunked_cfg, chunked)
    return full, chunked


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_chunked_loss_equals_full_logits_loss_and_gradients(family, monkeypatch):
    monkeypatch.setattr(losses, "MAX_CHUNK_ELEMENTS", 7 * 1024)  # 4 tokens a chunk: 12 chunks, the last short
    full, chunked = _pair(family)
    ids = torch.randint(5, 1000, (2, 23))
    labels = ids.clone()
    labels[0, :5] = -100  # ignored positions stay ignored
    a, b = full(input_ids=ids, labels=labels), chunked(input_ids=ids, labels=labels)
    assert b.logits is None
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
    a.loss.backward()
    b.loss.backward()
    named = dict(chunked.named_parameters())
    for name, p in full.named_parameters():
        torch.testing.assert_close(named[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # evaluation: the same loss, no gradients computed
        torch.testing.assert_close(
            chunked(input_ids=ids, labels=labels).loss, a.loss.detach(), rtol=1e-5, atol=1e-6
        )
        assert chunked(input_ids=ids).logits.shape == (
            2,
            23,
            full.config.vocab_size,
        )  # no labels: own forward


def test_full_logits_are_never_created(monkeypatch):
    monkeypatch.setattr(losses, "MAX_CHUNK_ELEMENTS", 64 * 1024)  # 64 tokens a chunk
    full, chunked = _pair("gpt2")
    ids = torch.randint(5, 1000, (4, 128))
    sizes = {}
    for name, model in (("full", full), ("chunked", chunked)):
        with _LargestTensor() as seen:
            model(input_ids=ids, labels=ids).loss.backward()
        sizes[name] = seen.largest
    logits = ids.numel() * full.config.vocab_size
    assert sizes["full"] >= logits  # the check sees HF's full logits
    assert sizes["chunked"] < logits, (
        sizes
    )  # its largest is the MLP activation, 512 x 512; a chunk is 64 x 1000


@pytest.mark.parametrize(
    "preset,override",
    [("roberta-tiny", []), ("t5-tiny", []), ("gpt2-tiny", ["deepspeed.zero_stage=3"])],
)
def test_refused_at_load_where_it_cannot_apply(preset, override):
    with pytest.raises(ConfigError, match="objective.chunked_loss"):
        load_config(f"configs/{preset}.yaml", ["objective.chunked_loss=true", *override])
