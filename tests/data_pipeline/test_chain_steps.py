"""Issue 65 item 4: the cleaning chain's steps declared once. A built-in step's settings are its constructor's and
the config derives its `data.clean.<name>` section from them; the built-ins and their order come from the
`lmstack.filters` entry points and nothing else lists them; decontamination is an ordinary step of the chain; PII
redaction is a formatter with its own base class and counts; old configs load, and a removed key is refused at
load naming its replacement."""

from __future__ import annotations

import ast
import inspect
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from core.document import Document
from core.errors import ConfigError
from core.registry import FILTERS
from data_pipeline.clean import run_clean
from data_pipeline.filters.registry import build_filters, replaced_defaults_note
from data_pipeline.formatters.base import Formatter
from data_pipeline.formatters.pii import PiiFormatter
from runconfig import load_config
from runconfig.filters import RUN_CONFIG_PARAM, builtin_steps, setting_names, step_settings
from runconfig.load import validate_dict

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "runconfig", "data_pipeline", "adapt", "launch")
ARTICLE = (
    "The council met on Tuesday to discuss the new bridge over the river, which has been closed since spring.\n"
    "Residents said the closure had added an hour to their daily journeys and hurt local shops badly.\n"
    "Engineers told the meeting that repairs would begin next month and take about six weeks to finish.\n"
    "The mayor thanked everyone for their patience and promised regular updates on the progress of the work.\n"
    "A public meeting will be held in the town hall next week for anyone who wants to ask more questions.\n"
)


def _data(clean: dict | None = None, **source) -> dict:
    return {
        "data": {
            "sources": [{"name": "a", "format": "jsonl", "paths": ["x"], **source}],
            "clean": clean or {},
        }
    }


@pytest.mark.timeout(60)
def test_builtin_steps_are_the_entry_points_in_their_order():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["lmstack.filters"]
    assert builtin_steps() == tuple(table) and len(table) == 9
    cfg = validate_dict(_data())
    clean = cfg.data.clean
    for name in builtin_steps():  # every built-in has its section, typed by its constructor
        assert type(clean.section(name)) is step_settings(name) is type(getattr(clean, name))
        factory = FILTERS.get(name)
        target = factory.__init__ if isinstance(factory, type) else factory
        params = [p for p in inspect.signature(target).parameters if p not in ("self", RUN_CONFIG_PARAM)]
        assert setting_names(step_settings(name)) == sorted(["enabled", *params]), name
    # the default chain is the entry points' order (those with something to do)
    assert [n for n, _ in build_filters(clean, cfg)] == [
        n for n in table if n not in ("url", "decontaminate", "fineweb")
    ]


@pytest.mark.timeout(60)
def test_no_product_module_lists_the_builtin_steps():
    """A literal naming two or more built-in steps (a hand list, a dict of presets, a splice by position), or a
    module naming three or more (registrations, a table of sections), is the duplication this issue removes; a
    name where one step is used (`unicode` for the fine-tune text repair) is fine. At 69af373 this found
    runconfig/filters.py, runconfig/data.py, data_pipeline/filters/__init__.py and data_pipeline/clean.py.
    pretrain/ (the model card's list of quality rules) is another engineer's room and is not scanned here."""
    steps = set(builtin_steps())
    hits = []
    for pkg in PRODUCT:
        for path in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in steps}
            if len(named) >= 3:
                hits.append(f"{path.relative_to(ROOT)}: {sorted(named)}")
            for node in ast.walk(tree):
                items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
                if isinstance(node, ast.Dict | ast.List | ast.Tuple | ast.Set) and items:
                    in_literal = {i.value for i in items if isinstance(i, ast.Constant) and i.value in steps}
                    if len(in_literal) >= 2:
                        hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(in_literal)}")
    assert hits == []


@pytest.mark.timeout(60)
def test_decontamination_is_a_step_the_config_orders(tmp_path):
    (tmp_path / "eval.jsonl").write_text(json.dumps({"id": "e1", "text": ARTICLE.splitlines()[2]}) + "\n")
    rows = [{"id": "leak", "text": ARTICLE}, {"id": "other", "text": ARTICLE.replace("repairs", "works")}]
    (tmp_path / "crawl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = {
        "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
        "run": {"output_dir": str(tmp_path / "out")},
        "data": {
            "sources": [{"name": "crawl", "format": "jsonl", "paths": [str(tmp_path / "crawl.jsonl")]}],
            "clean": {"workers": 1, "progress": False},
            "decontaminate": {"tasks": False, "sources": [str(tmp_path / "eval.jsonl")]},
        },
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(base))
    cfg = load_config(path)
    chain = [n for n, _ in build_filters(cfg.data.clean, cfg)]
    assert chain[:3] == [
        "unicode",
        "decontaminate",
        "langid",
    ]  # its entry point's place: after unicode repair
    moved = load_config(path, ["data.clean.filters=[decontaminate, unicode]"])
    assert [n for n, _ in build_filters(moved.data.clean, moved)] == ["decontaminate", "unicode"]
    assert run_clean(moved)["dropped_by_reason"] == {"decontaminated": 1}
    # switched off for one source as any step is, and a list that leaves it out says so
    off = load_config(path, ["data.sources.0.clean={decontaminate: {enabled: false}}"])
    assert "decontaminate" not in [n for n, _ in build_filters(off.data.clean_for("crawl"), off)]
    note = replaced_defaults_note(load_config(path, ["data.clean.filters=[unicode, c4]"]).data.clean)
    assert note is not None and "decontaminate" in note.split("leaves out the built-in filters ")[1]
    with pytest.raises(ValueError, match="step decontaminate needs the run's config"):
        build_filters(cfg.data.clean)


@pytest.mark.timeout(60)
def test_pii_is_a_formatter_that_keeps_every_document_and_counts_apart():
    p = PiiFormatter()
    assert isinstance(p, Formatter)
    plain, mail = (
        Document(id="a", text="nothing to see"),
        Document(id="b", text="write to jo@mail.example.org"),
    )
    assert p(plain) == (True, None) and p(mail) == (True, None) and mail.text == "write to email@example.com"
    assert p.stats == {"email": 1, "documents_changed": 1}
    assert p(mail) == (True, None) and p.stats == {"email": 1, "documents_changed": 1}  # its output is stable


@pytest.mark.timeout(60)
def test_removed_and_mistyped_step_settings_are_refused_at_load_in_one_line():
    cases = [
        (
            _data({"pii": {"email_replacement": "x"}}),
            "data.clean.pii.email_replacement was removed ('x' given): the placeholders are fixed",
        ),
        (
            _data({"filters": ["unicode", {"name": "pii", "params": {"phone_replacement": "x"}}]}),
            "data.clean.filters.1.params: phone_replacement: removed from step pii",
        ),
        (_data(clean_preset="curated"), None),
        (
            _data({"c4": {"min_num_sentences": "five"}}),
            "data.clean.c4.min_num_sentences: Input should be a valid",
        ),
        (
            _data({"langid": {"threshold": 1.5}}),
            "data.clean.langid.threshold: Input should be less than or equal",
        ),
        (_data({"gopher_quality": {"min_stop_word": 1}}), "did you mean 'min_stop_words'"),
        (_data({"lang_id": {}}), "data.clean.lang_id: unknown key; did you mean 'langid'"),
    ]
    for data, want in cases:
        if want is None:
            validate_dict(data)
            continue
        with pytest.raises(ConfigError) as e:
            validate_dict(data)
        lines = str(e.value).splitlines()
        assert len(lines) == 2 and want in lines[1], str(e.value)
    moved = str(pytest.raises(ConfigError, validate_dict, _data({"pii": {"ipv4_replacement": "x"}})).value)
    assert "PLACEHOLDERS" in moved  # names where the placeholders now are
    per_source = _data(clean_preset="curated")
    per_source["data"]["sources"][0]["clean"] = {"pii": {"ipv6_replacement": "x"}}
    with pytest.raises(
        ConfigError, match=r"data.sources.0.clean.pii.ipv6_replacement: removed from step pii"
    ):
        validate_dict(per_source)


@pytest.mark.timeout(60)
def test_old_section_keys_still_load():
    """Every key the hand-written sections had (but the PII placeholders) loads with the same meaning."""
    old = {
        "unicode": {"enabled": True, "fix_text": True, "normalization": "NFKC"},
        "c4": {
            "enabled": True,
            "split_paragraph": True,
            "remove_citations": True,
            "filter_no_terminal_punct": True,
            "min_num_sentences": 3,
            "min_words_per_line": 3,
            "max_word_length": 1000,
            "filter_lorem_ipsum": True,
            "filter_javascript": True,
            "filter_curly_bracket": True,
            "filter_policy": True,
            "filter_bad_words": False,
        },
        "gopher_quality": {
            "enabled": True,
            "min_doc_words": 50,
            "max_doc_words": 100000,
            "min_avg_word_length": 3,
            "max_avg_word_length": 10,
            "max_symbol_word_ratio": 0.1,
            "max_bullet_lines_ratio": 0.9,
            "max_ellipsis_lines_ratio": 0.3,
            "max_non_alpha_words_ratio": 0.8,
            "min_stop_words": 2,
        },
        "gopher_repetition": {
            "enabled": True,
            "dup_line_frac": 0.3,
            "dup_para_frac": 0.3,
            "dup_line_char_frac": 0.2,
            "dup_para_char_frac": 0.2,
            "top_n_grams": [[2, 0.2]],
            "dup_n_grams": [[5, 0.15]],
        },
        "langid": {"enabled": True, "languages": ["en", "fr"], "threshold": 0.5},
        "fineweb": {
            "enabled": True,
            "line_punct_thr": 0.12,
            "line_punct_exclude_zero": False,
            "short_line_thr": 0.67,
            "short_line_length": 30,
            "char_duplicates_ratio": 0.01,
            "new_line_ratio": 0.3,
        },
        "url": {"enabled": True, "soft_word_threshold": 2},
        "pii": {"enabled": True, "kinds": ["email", "ip"], "only_public_ips": False},
    }
    cfg = validate_dict(_data(old))
    chain = dict(build_filters(cfg.data.clean, cfg))
    assert chain["unicode"].normalization == "NFKC" and chain["c4"].min_num_sentences == 3
    assert chain["gopher_repetition"].top_n_grams == [(2, 0.2)] and chain["langid"].languages == {"en", "fr"}
    assert chain["pii"].kinds == ("email", "ip") and not chain["pii"].public_only and "fineweb" in chain


@pytest.mark.timeout(120)
def test_a_config_with_derived_sections_crosses_to_a_fresh_process(tmp_path):
    """The pool's spawn start and Ray pickle the config: a derived section's class is found again by name."""
    cfg = validate_dict(_data({"c4": {"min_num_sentences": 2}}))
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(cfg))
    code = (
        "import pickle, sys; c = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(type(c.data.clean.c4).__name__, c.data.clean.c4.min_num_sentences)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cfg.pkl")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0 and out.stdout.split() == ["c4_settings", "2"], out.stderr


OUTSIDE = '''
class Cap:
    """Drops a document longer than `limit` words."""

    def __init__(self, limit: int = 100, label: str = "cap"):
        self.limit, self.label = limit, label

    def __call__(self, doc):
        return (False, self.label) if len(doc.text.split()) > self.limit else (True, None)


def loose(**anything):
    return lambda doc: (True, None)
'''


@pytest.mark.timeout(60)
def test_an_outside_steps_params_are_typed_by_its_constructor(tmp_path, monkeypatch):
    """A `module:Name` step brings no settings model: its constructor's keywords type its params, checked when the
    clean stage starts (before any shard), as a built-in's are at load."""
    from data_pipeline.filters.registry import check_filter_settings

    (tmp_path / "outside_steps.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(tmp_path))
    bad = validate_dict(
        _data({"filters": ["unicode", {"name": "outside_steps:Cap", "params": {"limit": "many"}}]})
    )
    with pytest.raises(
        ConfigError, match=r"data.clean.filters.1.params.limit: Input should be a valid integer"
    ):
        check_filter_settings(bad)
    typo = validate_dict(_data({"filters": [{"name": "outside_steps:Cap", "params": {"limt": 3}}]}))
    with pytest.raises(ConfigError, match=r"params.limt: Extra inputs .*takes \['label', 'limit'\]"):
        check_filter_settings(typo)
    ok = validate_dict(_data({"filters": [{"name": "outside_steps:Cap", "params": {"limit": "3"}}]}))
    check_filter_settings(ok)
    ((name, step),) = build_filters(ok.data.clean, ok)
    assert step.limit == 3 and step(Document(id="a", text="one two three four")) == (False, "cap")
    # a factory taking **kwargs takes any key
    free = validate_dict(_data({"filters": [{"name": "outside_steps:loose", "params": {"whatever": 1}}]}))
    check_filter_settings(free)
    assert [n for n, _ in build_filters(free.data.clean, free)] == ["outside_steps:loose"]


@pytest.mark.timeout(60)
def test_the_reference_lists_every_steps_settings_from_its_constructor():
    text = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    for name in builtin_steps():
        assert f"\n## `data.clean.{name}`\n" in text, name
        for key in setting_names(step_settings(name)):
            assert f"| `data.clean.{name}.{key}` |" in text, (name, key)
    row = next(line for line in text.splitlines() if line.startswith("| `data.clean.langid.threshold` |"))
    assert "smallest probability" in row  # the comment beside the constructor's parameter
    # the PII placeholders are no keys: the reference names them only in its table of removed keys
    live = text.split("\n## Removed keys")[0]
    assert "replacement` |" not in live and "| `data.clean.pii.email_replacement` |" in text
