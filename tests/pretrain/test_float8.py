"""FP8 training (`model.float8`, issue 69 item 2) on CPU through torchao's emulation (the same float8 casts and
scales, with high-precision matmuls): the refusals at load and on the device, the layers converted, and through
the real DeepSpeed engine on 2 ranks, a tiny Llama's and a tiny GPT-2's loss against bf16, an exact resume after a SIGKILL, and an
export that is the plain Hugging Face folder a bf16 run exports, computing the engine's high-precision function."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from pretrain.checkpoint import complete_tags
from pretrain.checkpoint.parity import high_precision
from pretrain.export.convert import consolidated_state_dict
from pretrain.run import float8
from pretrain.run.models import build_model
from pretrain.tools.plan import _VocabOnly
from runconfig import ConfigError, load_config
from tests.pretrain.conftest import ROOT, child_env, run_module, sigkill, start_training, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = pytest.mark.timeout(120)

TINY = "configs/llama-tiny.yaml"
LAYER_LINEARS = [f"self_attn.{n}_proj" for n in "qkvo"] + [f"mlp.{n}_proj" for n in ("gate", "up", "down")]


@pytest.mark.parametrize(
    "config,overrides,message",
    [
        (
            "configs/roberta-tiny.yaml",
            ["model.float8=rowwise"],
            "model.float8: rowwise is not declared for family 'roberta' (its spec has no float8_linears); families "
            "with FP8: gpt2, llama",
        ),
        (
            "configs/gpt2-tiny.yaml",
            ["model.float8=rowwise", "model.ffn_size=200"],
            "model.float8: the block linear 'mlp.c_fc' is 128x200",
        ),
        (
            TINY,
            ["model.float8=tensorwise", "deepspeed.precision=fp16"],
            "deepspeed.precision bf16 (or fp32), not fp16",
        ),
        (
            TINY,
            ["model.float8=rowwise", "deepspeed.zero_stage=3"],
            "model.float8: rowwise needs deepspeed.zero_stage 0-2",
        ),
        (
            TINY,
            ["model.float8=rowwise", "model.ffn_size=360"],
            "model.float8: the block linear 'mlp.gate_proj' is 128x360; FP8 matmuls need both widths to be multiples of 16",
        ),
        (
            TINY,
            ["model.float8=rowwise", "model.options.num_kv_heads=1", "model.num_heads=16"],
            "model.float8: the block linear 'self_attn.k_proj' is 128x8",
        ),
        (
            TINY,
            ["model.float8_emulate=true"],
            "model.float8_emulate applies to model.float8: tensorwise or rowwise",
        ),
        (TINY, ["model.float8=fp8"], "model.float8: Input should be 'none', 'tensorwise' or 'rowwise'"),
    ],
)
def test_bad_float8_configs_are_refused_at_load_naming_the_key(config, overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(config, overrides)
    assert message in str(e.value), str(e.value)


def test_float8_is_refused_on_a_device_without_float8_matmuls(monkeypatch):
    m = load_config(TINY, ["model.float8=rowwise"]).model
    with pytest.raises(
        ValueError, match=r"model.float8: rowwise needs a CUDA GPU .* trains on cpu\); model.float8_emulate"
    ):
        float8.check_device(m, torch.device("cpu"))
    # an A100 (8.0): the capability is what decides, read from the rank's device
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(
        ValueError, match=r"compute capability >= 8.9 .*A100-SXM4-80GB is 8.0: use model.float8: none"
    ):
        float8.check_device(m, torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    float8.check_device(m, torch.device("cuda", 0))  # Hopper: accepted
    emulated = load_config(TINY, ["model.float8=rowwise", "model.float8_emulate=true"]).model
    float8.check_device(emulated, torch.device("cpu"))


GPT2_LINEARS = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


@pytest.mark.parametrize(
    "config,recipe,layers,head,module",
    [
        (TINY, "tensorwise", LAYER_LINEARS, "lm_head", "model.layers"),
        (TINY, "rowwise", LAYER_LINEARS, "lm_head", "model.layers"),
        ("configs/gpt2-tiny.yaml", "tensorwise", GPT2_LINEARS, "lm_head", "transformer.h"),
        ("configs/gpt2-tiny.yaml", "rowwise", GPT2_LINEARS, "lm_head", "transformer.h"),
    ],
)
def test_conversion_covers_exactly_the_decoder_blocks_linears(config, recipe, layers, head, module):
    cfg = load_config(
        config,
        [f"model.float8={recipe}", "model.float8_emulate=true", "model.num_layers=3", "model.dropout=0"],
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    plain = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    plain.load_state_dict(model.state_dict())
    model.train(False), plain.train(False)
    keys = list(model.state_dict())
    names = float8.convert(model, cfg.model)
    want = [f"{module}.{i}.{n}" for i in range(3) for n in layers]
    assert sorted(names) == sorted(want)
    converted = {n for n, x in model.named_modules() if type(x).__name__ in ("Float8Linear", "Float8Conv1D")}
    assert converted == set(want)
    # the head and the embeddings stay high precision; the weights keep their names (checkpoints, export)
    assert type(model.get_submodule(head)) is torch.nn.Linear
    assert type(model.get_input_embeddings()) is torch.nn.Embedding
    assert list(model.state_dict()) == keys
    assert all(
        model.state_dict()[k] is not None and model.state_dict()[k].shape == plain.state_dict()[k].shape
        for k in keys
    )

    ids = torch.randint(0, 1000, (2, 32))
    with torch.no_grad():
        ours, ref = model(input_ids=ids).logits, plain(input_ids=ids).logits
        with high_precision(model):
            exact = model(input_ids=ids).logits
    # the float8 casts move the logits a little, high_precision runs the very function of the plain model
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.1, rel
    assert torch.equal(exact, ref)
    with torch.no_grad():  # and the module is float8 again after it
        assert torch.equal(model(input_ids=ids).logits, ours)
    # gradients reach every weight through the float8 matmuls
    model.train(True)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(
        p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad
    )


def test_a_family_whose_blocks_differ_from_its_declaration_stops_the_run(monkeypatch):
    cfg = load_config(TINY, ["model.float8=tensorwise", "model.float8_emulate=true"])
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    model.model.layers[1].mlp.extra = torch.nn.Linear(128, 128)
    with pytest.raises(ValueError, match=r"block 1 \(LlamaDecoderLayer\) holds the linears .*'mlp.extra'"):
        float8.convert(model, cfg.model)


# --- through the engine: 2 CPU ranks, ZeRO-2, bf16, a tiny Llama -------------------------------------------------

STEPS = 8
RUN = [
    f"schedule.total_steps={STEPS}",
    "schedule.warmup_steps=2",
    "deepspeed.precision=bf16",
    "deepspeed.zero_stage=2",
    "model.hidden_size=64",
    "model.num_heads=4",
    "optim.lr=3.0e-3",
    "checkpoint.every_steps=4",
    "eval.every_steps=4",
    "logging.every_steps=1",
]
FP8 = ["model.float8=rowwise", "model.float8_emulate=true"]
FAMILY_RUN = {  # family: (its shape overrides, linears converted in 2 blocks, the export's class)
    "llama": (["model.ffn_size=176", "model.options.num_kv_heads=2"], 14, "LlamaForCausalLM"),
    "gpt2": (["model.ffn_size=256", "model.dropout=0", "model.attention_dropout=0"], 8, "GPT2LMHeadModel"),
}


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def _losses(out: Path, split: str = "train") -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _rows(out) if r["split"] == split}


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", list(FAMILY_RUN))
def test_fp8_trains_like_bf16_resumes_exactly_and_exports_as_a_bf16_run_does(family, request, tmp_path):
    run_config = request.getfixturevalue(
        f"{family}_run"
    )  # the family's prepared data stages (session fixtures)
    shape, n_linears, architecture = FAMILY_RUN[family]
    overrides = [*RUN, *shape]
    runs = {}
    for name, extra in (("bf16", []), ("fp8", FP8)):
        (tmp_path / name).mkdir()
        out = isolated(run_config, tmp_path / name)
        res = torchrun(run_config, [out, *overrides, *extra], timeout=400)
        runs[name] = Path(out.split("=", 1)[1])
        if name == "fp8":
            assert f"FP8 (rowwise, emulated): {n_linears} linears in 2 blocks" in res.stdout + res.stderr
            assert (
                "Failed to load" not in res.stdout + res.stderr
            )  # torchao's import noise stays off the console
    bf16, fp8 = _losses(runs["bf16"]), _losses(runs["fp8"])
    assert sorted(fp8) == list(range(1, STEPS + 1))
    # the float8 run learns as bf16 does: the loss falls, and at every step stays within 2% of bf16's
    assert fp8[STEPS] < fp8[1] - 0.2, fp8
    for step in fp8:
        assert abs(fp8[step] - bf16[step]) <= 0.02 * bf16[step], (step, fp8[step], bf16[step])
    assert fp8 != bf16  # the casts are really there
    eval_bf16, eval_fp8 = _losses(runs["bf16"], "eval"), _losses(runs["fp8"], "eval")
    assert abs(eval_fp8[STEPS] - eval_bf16[STEPS]) <= 0.02 * eval_bf16[STEPS]

    # a SIGKILL after the step-4 checkpoint, then a rerun: bit for bit the uninterrupted FP8 run
    (tmp_path / "killed").mkdir()
    out = isolated(run_config, tmp_path / "killed")
    killed = Path(out.split("=", 1)[1])
    with open(tmp_path / "killed.log", "w") as log:
        p = start_training(run_config, [out, *overrides, *FP8], log)
        deadline = time.time() + 400
        while "step00000004" not in complete_tags(killed / "checkpoints") and p.poll() is None:
            assert time.time() < deadline
            time.sleep(0.05)
        assert p.poll() is None, "the run ended before the kill"
        sigkill([psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)])
        p.wait(timeout=30)
        p = start_training(run_config, [out, *overrides, *FP8], log)
        assert p.wait(timeout=400) == 0, (tmp_path / "killed.log").read_text()[-4000:]
    assert "resumed from" in (tmp_path / "killed.log").read_text()
    tag = f"step{STEPS:08d}"
    ref, got = (
        consolidated_state_dict(runs["fp8"] / "checkpoints", tag),
        consolidated_state_dict(killed / "checkpoints", tag),
    )
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert _losses(killed) == fp8

    # the exports: plain Hugging Face folders of the family's class, the FP8 run's as the bf16 run's; each
    # computes its engine's high-precision function on the parity batch (the probe; bf16 runs keep no fp32 bound)
    parity = {}
    for name, extra in (("bf16", []), ("fp8", FP8)):
        run_module(
            [
                "-m",
                "pretrain",
                "export",
                "--config",
                str(run_config),
                f"run.output_dir={runs[name]}",
                *overrides,
                *extra,
            ]
        )
        export = runs[name] / "export"
        assert json.loads((export / "config.json").read_text())["architectures"] == [architecture]
        assert "float8" not in (export / "config.json").read_text().lower()
        check = subprocess.run(
            [sys.executable, "-c", LOAD_EXPORT, str(export), str(runs[name] / "checkpoints" / tag)],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert check.returncode == 0, check.stderr[-3000:]
        parity[name] = json.loads(check.stdout.splitlines()[-1])
        state = json.loads((export / "training_state.json").read_text())
        assert state["parity_max_abs_diff"] == pytest.approx(parity[name]["parity_max_abs"], abs=1e-4)
    assert parity["fp8"]["linear_types"] == parity["bf16"]["linear_types"]  # Linear (Llama), Conv1D (GPT-2)
    assert parity["fp8"]["linear_types"] and not any("Float8" in t for t in parity["fp8"]["linear_types"])
    # the same weights' dtypes as the bf16 run's export, in the model and in the file: nothing float8 is saved
    assert parity["fp8"]["dtypes"] == parity["bf16"]["dtypes"]
    assert parity["fp8"]["file_dtypes"] == parity["bf16"]["file_dtypes"]
    assert not any("float8" in d for d in parity["fp8"]["file_dtypes"])
    # the float8 casts are not in the probe: the FP8 export is as close to its engine as the bf16 one is
    assert parity["fp8"]["parity_max_abs"] <= max(2 * parity["bf16"]["parity_max_abs"], 1e-3), parity


# The export loaded as a user would: its weights' dtypes (loaded and in the file), the layer types,
# and its logits on the checkpoint's parity batch against the engine's stored (high-precision) logits.
LOAD_EXPORT = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from pretrain.checkpoint import safe_load
path, ckpt = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(path).eval()
probe = safe_load.load(Path(ckpt) / "parity_probe.pt")
with torch.no_grad():
    logits = model(**probe["inputs"]).logits.float()
print(json.dumps({
    "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    "file_dtypes": sorted({str(t.dtype) for t in load_file(Path(path) / "model.safetensors").values()}),
    "linear_types": sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith(("_proj", ".c_attn", ".c_fc"))}),
    "parity_max_abs": float((logits - probe["logits"]).abs().max()),
}))
"""


def test_pretrain_train_refuses_fp8_on_cpu_in_one_line_before_anything_is_built(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "train",
            "--config",
            TINY,
            f"run.output_dir={tmp_path}",
            "model.float8=rowwise",
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        "error: model.float8: rowwise needs a CUDA GPU of compute capability >= 8.9 (this rank trains on cpu); "
        "model.float8_emulate: true runs torchao's emulation instead (tests, no speed-up)"
    )
    assert "Traceback" not in res.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["logs"]  # nothing built: no checkpoints, no metrics
