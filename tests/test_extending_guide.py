"""docs/extending.md followed literally (issue 47 item 1): for each kind, the worked example's file is written
where its first line says, its entry point line is added to a copy of pyproject.toml (the built-ins' one list), and
its config is loaded and the new piece run: a family builds its model, an objective collates a batch, a filter
drops a document, a reader reads a file, an executor is built from the config, a convention is found, an
adaptation method fine-tunes the guide's own outside family (beside LoRA) through `adapt finetune` and `adapt
transfer`, an outside package's callback stops a real training run with its exit code. If the guide
and the code disagree (a name moved, a signature changed, an entry the registry does not read), this fails."""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

import core.registry as registry
from runconfig import ConfigError, load_config
from tests.data_pipeline.test_objective_mlm import _full_sentences, wordpiece  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
KINDS = {
    "A model family": "families",
    "An objective": "objectives",
    "A cleaning filter": "filters",
    "A reader (input format)": "readers",
    "An executor": "executors",
    "A tokenizer convention": "tokenizer_conventions",
    "An adaptation method": "adapt_methods",
    "A training callback": "callbacks",
}
PACKAGES = ("core", "runconfig", "data_pipeline", "pretrain", "adapt", "launch")


def guide_examples() -> dict[str, dict[str, str]]:
    """Per kind section: its python, toml and yaml blocks (one of each, in the worked example)."""
    out: dict[str, dict[str, str]] = {}
    for part in re.split(r"^## ", GUIDE.read_text(encoding="utf-8"), flags=re.M)[1:]:
        title, body = part.split("\n", 1)
        if title in KINDS:
            blocks: dict[str, str] = {}
            for lang, code in FENCE.findall(body):
                assert lang not in blocks, f"{title}: more than one {lang} block"
                blocks[lang] = code
            out[KINDS[title]] = blocks
    return out


def test_the_guide_has_a_worked_example_per_kind():
    examples = guide_examples()
    assert set(examples) == set(KINDS.values()) == set(registry.REGISTRIES)
    for kind, blocks in examples.items():
        assert set(blocks) == {"python", "toml", "yaml"}, (kind, sorted(blocks))
        assert blocks["python"].startswith("# file: "), kind
        assert f'[project.entry-points."lmstack.{kind}"]' in blocks["toml"], kind


def _add_entries(pyproject: str, toml_block: str) -> str:
    """The guide's entry lines under their table of pyproject.toml (the table appended when it is not there yet)."""
    header, *lines = [line for line in toml_block.strip().splitlines() if line.strip()]
    if header + "\n" in pyproject:
        return pyproject.replace(header + "\n", header + "\n" + "".join(f"{line}\n" for line in lines), 1)
    return pyproject + "\n" + toml_block


@pytest.fixture
def guide(tmp_path, monkeypatch):
    """Every worked example added as a built-in: its file under a tmp tree on its package's path, its entry in a
    copy of pyproject.toml that the registries read. Restores the registries afterwards."""
    examples = guide_examples()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    added: list[str] = []
    for blocks in examples.values():
        rel = blocks["python"].splitlines()[0].removeprefix("# file: ").strip()
        if rel.split("/")[0] not in PACKAGES:
            continue  # an outside package's example: installed as pip would (`install_outside`)
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(blocks["python"], encoding="utf-8")
        package = importlib.import_module(rel.rsplit("/", 1)[0].replace("/", "."))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str((tmp_path / rel).parent)])
        added.append(rel.removesuffix(".py").replace("/", "."))
        pyproject = _add_entries(pyproject, blocks["toml"])
    copy = tmp_path / "pyproject.toml"
    copy.write_text(pyproject, encoding="utf-8")
    monkeypatch.setattr(registry, "_PYPROJECT", copy)
    for reg in registry.REGISTRIES.values():
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
        monkeypatch.setattr(reg, "_entry_points_loaded", False)
    registry.builtin_entry_points.cache_clear()
    registry.group_entry_points.cache_clear()
    yield examples, tmp_path
    registry.builtin_entry_points.cache_clear()
    registry.group_entry_points.cache_clear()
    for module in added:
        sys.modules.pop(module, None)


def _config(tmp_path: Path, yaml_block: str, base: str = "roberta-tiny", **extra) -> Path:
    data = yaml.safe_load(yaml_block) | {"inherit": [str(ROOT / "configs" / f"{base}.yaml")]}
    data.setdefault("run", {})["output_dir"] = str(tmp_path / "out")
    for key, value in extra.items():
        data.setdefault(key, {}).update(value)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.timeout(120)
def test_guide_family(guide):
    from pretrain.run.models import build_model
    from pretrain.tools.plan import _VocabOnly

    examples, tmp = guide
    cfg = load_config(_config(tmp, examples["families"]["yaml"]))
    assert cfg.model.family == "tinybert" and "tinybert" in registry.FAMILIES.builtin_names()
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    assert type(model).__name__ == "BertForMaskedLM" and model.config.type_vocab_size == 1
    with pytest.raises(
        ConfigError, match=r"model.options.type_vocab_sizes.*family 'tinybert'.*type_vocab_size"
    ):
        load_config(_config(tmp, examples["families"]["yaml"]), ["model.options={type_vocab_sizes: 1}"])


@pytest.mark.timeout(120)
def test_guide_objective(guide, wordpiece):  # noqa: F811 (fixture)
    from data_pipeline.objectives import build_collator

    examples, tmp = guide
    cfg = load_config(_config(tmp, examples["objectives"]["yaml"], tokenizer={"type": "wordpiece"}))
    assert cfg.objective.type == "mlm_high"
    samples = _full_sentences(wordpiece, 16, 64, wordpiece.cls_token_id, wordpiece.sep_token_id)
    batch = build_collator(cfg, wordpiece)(samples)
    chosen = (batch["labels"] != -100).float().mean().item()
    assert 0.3 < chosen < 0.5, chosen  # the example's 40%, not MLM's 15%
    with pytest.raises(ConfigError, match=r"objective.options.rates.*objective 'mlm_high'.*rate"):
        load_config(_config(tmp, examples["objectives"]["yaml"]), ["objective.options={rates: 0.4}"])


@pytest.mark.timeout(120)
def test_guide_filter(guide):
    from core.document import Document
    from data_pipeline.filters.registry import build_step

    examples, tmp = guide
    cfg = load_config(_config(tmp, examples["filters"]["yaml"]))
    step = cfg.data.clean.filters[1]
    # its settings are the constructor's, from the YAML
    keep = build_step(cfg.data.clean, step.name, step.params)
    assert keep.max_upper_ratio == 0.6
    assert keep(Document(id="a", text="BUY NOW, CHEAP WATCHES", source="s"))[:2] == (False, "shouting")
    assert keep(Document(id="b", text="The harvest came in late this year.", source="s")) == (True, None)
    # the constructor's types are the config's: a bad value and a misspelt key are refused at load, named
    with pytest.raises(
        ConfigError, match=r"data.clean.filters.1.params: max_upper_ratio: Input should be less"
    ):
        load_config(_config(tmp, examples["filters"]["yaml"].replace("0.6", "2")))
    with pytest.raises(
        ConfigError, match=r"data.clean.shouting.max_upper: unknown key; did you mean 'max_upper_ratio'"
    ):
        load_config(_config(tmp, examples["filters"]["yaml"]), ["data.clean.shouting.max_upper=0.4"])


def _section_blocks(title: str) -> dict[str, str]:
    """The python, toml and yaml blocks of one `## <title>` section of the guide."""
    part = re.split(r"^## ", GUIDE.read_text(encoding="utf-8"), flags=re.M)
    body = next(p.split("\n", 1)[1] for p in part[1:] if p.split("\n", 1)[0] == title)
    return {lang: code for lang, code in FENCE.findall(body)}


@pytest.mark.timeout(120)
def test_guide_formatter(guide):
    """The guide's "A text formatter": its file, its entry in the filters group and its config, run as written."""
    from core.document import Document
    from data_pipeline.filters.registry import build_filters
    from data_pipeline.formatters.base import Formatter

    _, tmp = guide
    blocks = _section_blocks("A text formatter")
    assert set(blocks) == {"python", "toml", "yaml"} and '"lmstack.filters"' in blocks["toml"]
    rel = blocks["python"].splitlines()[0].removeprefix("# file: ").strip()
    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp / rel).write_text(blocks["python"], encoding="utf-8")
    package = importlib.import_module(rel.rsplit("/", 1)[0].replace("/", "."))
    sys.modules.pop(rel.removesuffix(".py").replace("/", "."), None)
    package.__path__.append(str((tmp / rel).parent))
    try:
        pyproject = tmp / "pyproject.toml"
        pyproject.write_text(
            _add_entries(pyproject.read_text(encoding="utf-8"), blocks["toml"]), encoding="utf-8"
        )
        registry.builtin_entry_points.cache_clear()
        registry.group_entry_points.cache_clear()
        registry.FILTERS._entry_points_loaded = False
        cfg = load_config(_config(tmp, blocks["yaml"]))
        assert cfg.data.clean.blank_lines.max_blank == 2
        step = dict(build_filters(cfg.data.clean, cfg))["blank_lines"]
        assert isinstance(step, Formatter)
        doc = Document(id="a", text="One.\n\n\n\n\nTwo.\n\n\nThree.", source="s")
        assert step(doc) == (True, None) and doc.text == "One.\n\n\nTwo.\n\n\nThree."
        assert step.stats == {"blank_runs": 1, "documents_changed": 1}
        assert (
            step(doc) == (True, None) and step.stats["documents_changed"] == 1
        )  # cleaned text stays as it is
        with pytest.raises(
            ConfigError, match=r"data.clean.blank_lines.max_blanks: unknown key; did you mean"
        ):
            load_config(_config(tmp, blocks["yaml"]), ["data.clean.blank_lines.max_blanks=1"])
    finally:
        package.__path__.remove(str((tmp / rel).parent))
        sys.modules.pop(rel.removesuffix(".py").replace("/", "."), None)


@pytest.mark.timeout(120)
def test_guide_reader(guide, monkeypatch):
    from data_pipeline.readers.base import SourceFile

    examples, tmp = guide
    (tmp / "notes").mkdir()
    (tmp / "notes" / "a.lines").write_bytes(b"first line\n\nsecond line\n")
    monkeypatch.setenv("NOTES", str(tmp / "notes"))
    cfg = load_config(_config(tmp, examples["readers"]["yaml"]))
    source = cfg.data.sources[0]

    class Errors:
        skipped: list[str] = []

        def skip(self, kind):
            self.skipped.append(kind)

    read = registry.READERS.get(source.format)
    docs = list(read(source, None, SourceFile(str(tmp / "notes" / "a.lines"), "a.lines"), Errors(), 1 << 20))
    assert [d.text for d in docs] == ["first line", "second line"] and Errors.skipped == ["empty_line"]
    assert read.traits.split is not None


@pytest.mark.timeout(120)
def test_guide_executor(guide):
    from data_pipeline.executors.base import build_executor

    examples, tmp = guide
    cfg = load_config(_config(tmp, examples["executors"]["yaml"]))
    assert type(build_executor(cfg)).__name__ == "InlineExecutor"


@pytest.mark.timeout(120)
def test_guide_tokenizer_convention(guide):
    examples, tmp = guide
    cfg = load_config(_config(tmp, examples["tokenizer_conventions"]["yaml"], base="gpt2-tiny"))
    conv = registry.TOKENIZER_CONVENTIONS.get(cfg.tokenizer.convention)
    assert conv.specials[1:] == ["<|im_start|>", "<|im_end|>"] and conv.tokenizer_class == "GPT2Tokenizer"


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_guide_adaptation_method_on_the_guide_family(guide):
    """The guide's BitFit, and LoRA, on the guide's own outside family (tinybert, model_type `bert`: found by its
    model class, init_from's rule): `adapt finetune` saves a folder whose body weights are the export's and whose
    biases moved; `adapt transfer` reports both methods by their descriptions, as the card does; a misspelled
    setting is refused at load."""
    from safetensors.torch import load_file

    from adapt.finetune import finetune
    from adapt.report import format_report
    from adapt.transfer import run_transfer
    from pretrain.export.model_card import _transfer_results
    from tests.adapt.test_finetune import TINY, _labelled_folder, _labelled_rows, export_of

    examples, tmp = guide
    rows = _labelled_rows(per_label=8, chars=300)
    folder = _labelled_folder(tmp, rows)
    task = f"finetune.tasks=[{{name: t, train: {folder}}}]"
    quick = [
        *TINY,
        task,
        "finetune.seeds=[0]",
        "finetune.lr_grid=[1.0e-3]",
        "finetune.epochs=1",
        "finetune.arms=[pretrained]",
        "finetune.probe=false",
        "finetune.max_length=64",
    ]
    path = _config(tmp, examples["adapt_methods"]["yaml"], model={"family": "tinybert"})
    cfg = load_config(path, quick)
    assert (
        cfg.finetune.methods == ["bitfit", "lora"] and cfg.finetune.settings_of("bitfit").layer_norm is False
    )
    assert "bitfit" in registry.ADAPT_METHODS.builtin_names()
    export = export_of(cfg, [r[1] for r in rows])
    assert json_of(export / "config.json")["model_type"] == "bert"  # not a family name: found by its class

    [bitfit, lora] = finetune(cfg, export, "pretrained", tmp / "ft", log=lambda *_: None)
    assert (bitfit["method"], lora["method"]) == ("bitfit", "lora")
    before = load_file(str(export / "model.safetensors"))
    after = load_file(str(tmp / "ft" / "t" / "bitfit" / "pretrained" / "seed0" / "model.safetensors"))
    weight, bias = (
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.0.attention.self.query.bias",
    )
    assert (after[weight] == before[weight]).all() and not (after[bias] == before[bias]).all()
    assert (tmp / "ft" / "t" / "lora" / "pretrained" / "seed0" / "adapter_config.json").is_file()

    report = run_transfer(cfg, export, tmp / "transfer", log=lambda *_: None)
    methods = report["tasks"]["t"]["methods"]
    assert set(methods) == {"bitfit", "lora"} and methods["bitfit"]["arms"]["pretrained"]["test_accuracy"]
    text = format_report(report)
    assert "bitfit: bias terms only (BitFit)" in text and "lora: LoRA adapters" in text
    _, card_rows = _transfer_results(report)
    assert any("bias terms only (BitFit)" in row for row in card_rows)

    with pytest.raises(
        ConfigError, match=r"finetune.bitfit.layer_norms: not a key of adaptation method 'bitfit'"
    ):
        load_config(path, [*quick, "finetune.bitfit={layer_norms: true}"])
    with pytest.raises(ConfigError, match=r"unknown adaptation method 'bitfitt'.*did you mean 'bitfit'"):
        load_config(path, [*quick, "finetune.methods=[bitfitt]"])


def json_of(path: Path) -> dict:
    import json

    return json.loads(path.read_text(encoding="utf-8"))


def install_outside(blocks: dict[str, str], site: Path) -> str:
    """What `pip install --target site` leaves of an outside package's example: its module and a dist-info whose
    entry_points.txt holds the guide's entry lines. Returns the package's name."""
    rel = blocks["python"].splitlines()[0].removeprefix("# file: ").strip()
    package = rel.split("/")[0]
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_text(blocks["python"], encoding="utf-8")
    (site / package / "__init__.py").touch()
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    # entry_points.txt is INI: `[group]` and `name = module:attr`, without TOML's quotes
    entries = re.sub(r'\[project\.entry-points\."([^"]+)"\]', r"[\1]", blocks["toml"]).replace('"', "")
    (info / "entry_points.txt").write_text(entries)
    return package


@pytest.fixture
def outside_callback(tmp_path, monkeypatch):
    """The guide's callback installed as an outside package on sys.path; the registries see it afresh."""
    blocks = guide_examples()["callbacks"]
    site = tmp_path / "site"
    package = install_outside(blocks, site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry.CALLBACKS, "_entries", dict(registry.CALLBACKS._entries))
    monkeypatch.setattr(registry.CALLBACKS, "_entry_points_loaded", False)
    registry.group_entry_points.cache_clear()
    yield blocks, site
    registry.group_entry_points.cache_clear()
    for name in [m for m in sys.modules if m.split(".")[0] == package]:
        sys.modules.pop(name)


@pytest.mark.timeout(120)
def test_guide_callback_settings_are_checked_at_load(outside_callback, tmp_path):
    blocks, _ = outside_callback
    cfg = load_config(_config(tmp_path, blocks["yaml"], base="gpt2-tiny"))
    assert cfg.callbacks == {"loss_ceiling": {"max_loss": 1.0, "after_step": 2}}
    assert "loss_ceiling" in registry.CALLBACKS.entry_point_names()
    assert "loss_ceiling" not in registry.CALLBACKS.builtin_names()
    with pytest.raises(
        ConfigError,
        match=r"callbacks\.loss_ceiling\.max_los: not a key of callback 'loss_ceiling' \(its keys: after_step, max_loss\)",
    ):
        load_config(_config(tmp_path, blocks["yaml"], base="gpt2-tiny"), ["callbacks.loss_ceiling.max_los=1"])
    with pytest.raises(
        ConfigError, match=r"callbacks\.loss_ceiling\.after_step: Input should be a valid integer"
    ):
        load_config(
            _config(tmp_path, blocks["yaml"], base="gpt2-tiny"), ["callbacks.loss_ceiling.after_step=soon"]
        )
    with pytest.raises(ConfigError, match=r"unknown callback 'loss_cieling'.*did you mean 'loss_ceiling'"):
        load_config(_config(tmp_path, "callbacks: {loss_cieling: {max_loss: 1.0}}", base="gpt2-tiny"))


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(300)
def test_guide_callback_stops_a_real_run_with_its_exit_code(outside_callback, tmp_path):
    """2 gloo ranks, real DeepSpeed: the guard, found through its entry point alone, stops the run at the first
        step it judges (a tiny model's loss is far above 1.0 at step 2) with its own exit code, on every rank; the
    steps before it ran and logged as usual."""
    import subprocess

    from tests.pretrain.conftest import child_env, train_command
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run, train_losses

    blocks, site = outside_callback
    config, out = prepare_smoke_run(tmp_path)
    guarded = tmp_path / "guarded.yaml"
    guarded.write_text(yaml.safe_dump(yaml.safe_load(config.read_text()) | yaml.safe_load(blocks["yaml"])))
    env = child_env() | {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    res = subprocess.run(
        train_command(guarded, []), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    log = res.stdout + res.stderr
    assert res.returncode != 0, log[-4000:]
    assert re.search(r"exitcode\s*:\s*3\b", log), log[-4000:]  # the guard's own code, not a crash's 1
    said = "CallbackStop: loss "
    assert said in log and "above callbacks.loss_ceiling.max_loss 1.0 at step 2" in log, log[-4000:]
    assert sorted(train_losses(out)) == [1]  # stopped at step 2, before its row, on every rank alike
