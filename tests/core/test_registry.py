"""The one Registry type: names, entry points, and the error an unknown name raises."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError, LmstackError, PluginError, UnknownNameError
from core.registry import FAMILIES, REGISTRIES, Registry
from core.specs import FamilySpec, ObjectiveSpec

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_name_names_registry_name_known_and_a_close_one():
    reg: Registry[object] = Registry("widgets", "widget", "data.widget", "lmstack.test_widgets_none")
    reg.register("gopher_quality", object())
    reg.register("c4", object())
    with pytest.raises(UnknownNameError) as e:
        reg.get("gopher_qualty")
    err = e.value
    assert str(err) == (
        "unknown widget 'gopher_qualty' (registered: ['c4', 'gopher_quality']); "
        "did you mean 'gopher_quality'?"
    )
    assert err.registry == "widgets" and err.known == ["c4", "gopher_quality"]
    # One error type, caught as what each caller knew before: a config error, a KeyError, a ValueError.
    assert isinstance(err, ConfigError) and isinstance(err, LmstackError)
    assert isinstance(err, KeyError) and isinstance(err, ValueError)
    with pytest.raises(UnknownNameError, match=r"registered: \['c4', 'gopher_quality'\]\)$"):
        reg.get("zzz")  # no close match: no suggestion
    again = pickle.loads(pickle.dumps(err))  # as a process pool worker's error reaches the parent
    assert type(again) is UnknownNameError and str(again) == str(err) and again.known == err.known


def test_register_twice_is_refused_unless_replacing():
    reg: Registry[object] = Registry("widgets", "widget", "data.widget", "lmstack.test_widgets_none")
    a, b = object(), object()
    reg.register("a", a)
    reg.register("a", a)  # the same object again (a module imported twice) is fine
    with pytest.raises(PluginError, match="widgets: 'a' is registered twice"):
        reg.register("a", b)
    assert reg.register("a", b, replace=True) is b and reg.get("a") is b

    @reg.decorator("c")
    class C:
        pass

    assert reg.get("c") is C and reg.names() == ["a", "c"] and "c" in reg and len(reg) == 2


def test_a_whole_spec_is_registered_under_its_name():
    reg: Registry[FamilySpec] = Registry(
        "fams", "family", "model.family", "lmstack.test_none", spec_type=FamilySpec
    )

    def build(m, tok, vocab):
        return "config"

    spec = reg.add(
        FamilySpec(
            name="f", task="masked_lm", objectives=("mlm",), tokenizer_types=("bpe",), build_config=build
        )
    )
    assert reg.get("f") is spec and spec.build_config is build and spec.objectives == ("mlm",)
    assert spec.trains(ObjectiveSpec("mlm", ("full_sentences",)))
    assert not spec.trains(ObjectiveSpec("causal", ("contiguous",)))


def test_every_registry_is_declared_once_and_specs_are_data():
    assert set(REGISTRIES) == {
        "families",
        "objectives",
        "filters",
        "readers",
        "executors",
        "tokenizer_conventions",
        "adapt_methods",
        "callbacks",
    }
    assert {r.group for r in REGISTRIES.values()} == {f"lmstack.{n}" for n in REGISTRIES}
    # A built-in spec is found through its entry point (pyproject.toml), whole, and reading it imports no ML
    # framework: the spec modules keep torch and transformers inside their functions.
    code = (
        "import sys; from core.registry import FAMILIES, OBJECTIVES; "
        "f = FAMILIES.get('roberta'); o = OBJECTIVES.get('mlm'); "
        "assert f.build_config is not None and o.build_collator is not None and f.position_limit(514) == 512; "
        # the built-in callbacks' classes too (their settings are read at load): torch only inside their hooks
        "from core.registry import CALLBACKS; assert all(CALLBACKS.get(n).name == n for n in CALLBACKS.builtin_names()); "
        "assert not any(m.split('.')[0] in ('torch', 'transformers', 'deepspeed', 'launch', 'adapt') "
        "for m in sys.modules), sorted(sys.modules); "
        # an adaptation method's spec file is read the same way: its settings and hooks, no ML framework
        "from core.registry import ADAPT_METHODS; u = ADAPT_METHODS.get('ulmfit'); "
        "assert u.settings is not None and u.trainer is not None and ADAPT_METHODS.get('lora').wrap_model; "
        "assert not any(m.split('.')[0] in ('torch', 'transformers', 'peft', 'launch') "
        "for m in sys.modules), sorted(sys.modules)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert FAMILIES.get("roberta").model_class == "RobertaForMaskedLM"


def test_a_declared_family_without_implementation_is_named():
    from core.errors import PluginError
    from pretrain.families import get_family

    assert get_family("roberta").build_config is not None  # the built-ins are implemented
    FAMILIES.add(
        FamilySpec(name="declared_only", task="causal_lm", objectives=("causal",), tokenizer_types=("bpe",))
    )
    try:
        with pytest.raises(
            PluginError, match=r"model.family 'declared_only': its FamilySpec gives no build_config"
        ):
            get_family("declared_only")
    finally:
        del FAMILIES._entries["declared_only"]


def test_every_builtin_entry_point_names_the_finished_object_in_its_own_module():
    """A built-in is one file plus one entry, as an outside plug-in is: its entry point names an object
    (`module:attr`), never a package that registers its members on import."""
    from core.registry import builtin_entry_points

    for group, eps in builtin_entry_points().items():
        for ep in eps:
            assert ":" in ep.value, f"{group} {ep.name} = {ep.value}: names a module, not the object"
            obj = ep.load()
            assert not isinstance(obj, type(pickle)), f"{group} {ep.name} = {ep.value} is a module"
