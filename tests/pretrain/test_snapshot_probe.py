"""The export-parity probe computed off the step (`SnapshotProbe`): the module rebuilt on the meta device, given a
host snapshot of the trained module's weights, gives exactly the trained module's logits, for every family and
for the RTD wrapper, and lets the snapshot go afterwards."""

import copy

import pytest
import torch

from pretrain.checkpoint.parity import SnapshotProbe, probe_logits
from pretrain.checkpoint.staging import HostStaging
from pretrain.run.train import build_module
from pretrain.tools.plan import _VocabOnly
from runconfig import load_config

pytestmark = pytest.mark.timeout(120)

CASES = [
    ("gpt2-tiny", []),
    ("llama-tiny", []),
    ("roberta-tiny", []),
    ("t5-tiny", []),
    ("modernbert-tiny", []),
    ("electra-tiny", []),
    ("modernbert-tiny", ["objective.type=electra", "objective.options={generator_hidden_fraction: 0.25}"]),
]


@pytest.mark.parametrize("preset,overrides", CASES, ids=[c[0] + ("-rtd" if c[1] else "") for c in CASES])
def test_snapshot_probe_equals_the_trained_modules_logits(preset, overrides):
    cfg = load_config(f"configs/{preset}.yaml", overrides)
    tok = _VocabOnly(1000)
    torch.manual_seed(0)
    live = build_module(cfg, tok, weights=True)
    with torch.no_grad():  # weights a training run would have moved away from their init
        for p in live.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ids = torch.randint(5, 1000, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if cfg.model.family == "t5":
        batch["decoder_input_ids"] = torch.cat([torch.ones(2, 1, dtype=torch.long), ids[:, :7]], dim=1)
    probe = SnapshotProbe(lambda: build_module(cfg, tok, weights=False), live)
    staging = HostStaging()  # what an async save hands the probe: its host copy of the module's weights
    weights = staging.snapshot(live.state_dict(), "mp_rank_00_model_states.pt")
    staging.synchronize()
    metadata = copy.deepcopy(weights._metadata)
    ours = probe.logits(weights, batch)
    assert torch.equal(ours, probe_logits(live, batch))
    # the snapshot is the checkpoint's: left as it was, its metadata included (`load_state_dict(assign=True)` marks
    # the metadata it is given, and a resumed run's load would then assign instead of copy, breaking ZeRO's buckets)
    assert weights._metadata == metadata
    # the snapshot is not held past the probe, and the rebuilt module allocated nothing
    assert all(p.device.type == "meta" for p in probe.module.parameters())
    assert all(b.device.type == "meta" for b in probe.module.buffers())
    # another save's snapshot gives that save's logits
    with torch.no_grad():
        for p in live.parameters():
            p.mul_(0.5)
    refilled = staging.snapshot(live.state_dict(), "mp_rank_00_model_states.pt")
    assert torch.equal(probe.logits(refilled, batch), probe_logits(live, batch))
