"""YAML -> validated RunConfig, with `inherit:` presets and `key.sub=value` command-line overrides."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from core.errors import ConfigError
from core.io import atomic_write
from core.layout import RESOLVED_CONFIG
from runconfig.base import unknown_key_text
from runconfig.run import RunConfig


def _reject_duplicate_keys(node: yaml.Node, path: str, name: str) -> None:
    """PyYAML keeps the last of two equal keys without a word (`{lr: 1.0e-3, lr: 50.0}` trained at 50)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = f"{path}.{key_node.value}" if path else key_node.value
            if key_node.value in seen:
                first, again = seen[key_node.value].start_mark, key_node.start_mark
                raise ConfigError(
                    f"{name}: duplicate key '{key}': line {first.line + 1} column {first.column + 1} and line "
                    f"{again.line + 1} column {again.column + 1} (YAML would silently keep the second); keep one"
                )
            seen[key_node.value] = key_node
            _reject_duplicate_keys(value_node, key, name)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _reject_duplicate_keys(item, f"{path}.{i}" if path else str(i), name)


def yaml_load(text: str, name: str = "<string>") -> Any:
    """yaml.safe_load that rejects duplicate keys, naming the dotted key and both lines."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _reject_duplicate_keys(node, "", name)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml_load(path.read_text(), str(path)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _resolve_inherits(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: inherit cycle through {[str(p) for p in seen]}")
    data = _read_yaml(path)
    parents = data.pop("inherit", []) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict[str, Any] = {}
    for parent in parents:
        merged = deep_merge(merged, _resolve_inherits(path.parent / parent, (*seen, path)))
    return deep_merge(merged, data)


def parse_overrides(items: list[str]) -> list[tuple[list[str], Any]]:
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like key.sub=value")
        key, raw = item.split("=", 1)
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override '{item}': empty key segment")
        try:
            value = yaml_load(raw, f"override '{item}'") if raw != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{item}': value is not valid YAML: {e}") from e
        out.append((key.split("."), value))
    return out


def apply_override(data: dict[str, Any], keys: list[str], value: Any) -> list[int]:
    """Sets `keys` to `value` in the raw config. Returns the positions of digit segments that became new keys of
    a mapping: meant as list indexes, they are said as such if the schema refuses them (`_as_list_index`)."""
    node: Any = data
    digit_keys = []
    for i, k in enumerate(keys[:-1]):
        if isinstance(node, list):
            if not k.isdigit() or int(k) >= len(node):
                raise ConfigError(
                    f"override {'.'.join(keys)}: no list index {k} at {'.'.join(keys[:i]) or '<root>'}"
                )
            node = node[int(k)]
        else:
            if k.isdigit() and k not in node:
                digit_keys.append(i)
            node = node.setdefault(k, {})
            if not isinstance(node, dict | list):
                raise ConfigError(f"override {'.'.join(keys)}: {'.'.join(keys[: i + 1])} is not a mapping")
    last = keys[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"override {'.'.join(keys)}: no list index {last}")
        node[int(last)] = value
    else:
        if last.isdigit() and last not in node:
            digit_keys.append(len(keys) - 1)
        node[last] = value
    return digit_keys


def _as_list_index(err: ValidationError, digit_keys: list[tuple[list[str], int]]) -> str | None:
    """An override's digit segment the schema refused where the config files hold no list (a list left at its
    default, or a mapping): "no list index N", as for an index past a list's end."""
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        for keys, i in digit_keys:
            at = ".".join(keys[:i]) or "<root>"
            if e["type"] in ("list_type", "tuple_type") and loc == keys[:i]:
                return (
                    f"override {'.'.join(keys)}: no list index {keys[i]} at {at} (not in the config files: "
                    f"give the whole list, {at}=[...])"
                )
            if e["type"] == "extra_forbidden" and loc == keys[: i + 1]:
                return f"override {'.'.join(keys)}: no list index {keys[i]} at {at} (a mapping)"
    return None


def _section_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the config section at `loc` takes (best effort: [] where the schema walk cannot follow)."""
    import typing

    from pydantic import BaseModel

    def models(ann: Any) -> list[type[BaseModel]]:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return [m for a in typing.get_args(ann) for m in models(a)]

    def extra(c: type[BaseModel]) -> dict[str, Any]:
        """Sections a model takes beside its fields (data.clean: each step's, `extra_sections`)."""
        get = getattr(c, "extra_sections", None)
        return get() if callable(get) else {}

    current: list[type[BaseModel]] = [RunConfig]
    for part in loc:
        if isinstance(part, int):
            continue  # a list item: the list's item type was already taken
        nxt = [m for c in current if part in c.model_fields for m in models(c.model_fields[part].annotation)]
        nxt += [extra(c)[part] for c in current if part in extra(c)]
        if not nxt and not any(part in c.model_fields or part in extra(c) for c in current):
            continue  # a union's tag in the location (pydantic adds the member's name)
        current = nxt
    fields = {k for c in current for k, f in c.model_fields.items() if not f.exclude}  # not a removed key's
    return sorted(fields | {k for c in current for k in extra(c)})


def _format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            parent = tuple(e["loc"][:-1])
            msg = unknown_key_text(str(e["loc"][-1]), _section_keys(parent), ".".join(str(p) for p in parent))
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif "input" in e and e["type"] not in ("value_error",):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  {msg}" if key == "<root>" or msg.startswith(f"{key}") else f"  {key}: {msg}")
    return f"invalid config {source}:\n" + "\n".join(lines)


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> RunConfig:
    """Load a run YAML (with its `inherit:` chain), apply overrides, validate everything."""
    data = _resolve_inherits(Path(path))
    digit_keys = []
    for keys, value in parse_overrides(overrides or []):
        digit_keys += [(keys, i) for i in apply_override(data, keys, value)]
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_as_list_index(e, digit_keys) or _format_errors(e, str(path))) from None


def validate_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def save_resolved(cfg: RunConfig, folder: str | os.PathLike[str], name: str = RESOLVED_CONFIG) -> Path:
    """Every run writes the config it actually used next to its outputs."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    return atomic_write(out, yaml.safe_dump(to_dict(cfg), sort_keys=False))
