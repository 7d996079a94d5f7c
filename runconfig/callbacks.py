"""The run config's `callbacks:` key: outside callbacks switched on by name, each with its own typed settings.

    callbacks:
      loss_guard: {max_loss: 9.0}          # an entry point of lmstack.callbacks (an installed package)
      my_pkg.guards:LossGuard: {}          # or any importable class, no packaging

The built-ins (watchdog, spikes, probe, profiler, metrics, preemption) are always on and read their settings from
their own sections (`watchdog.*`, `spikes.*`, `eval.probe_*`, `logging.profile_steps`, the sinks' `logging.*`
keys), so every older config loads unchanged; naming one here is refused, pointing at its section. An
unknown name is refused naming the registered callbacks; a setting the callback's `Settings` does not declare, or
one of the wrong type, is refused naming its valid keys (core/callbacks.py).
"""

from __future__ import annotations

from typing import Any

from core.callbacks import Callback
from core.errors import ConfigError
from core.registry import CALLBACKS
from runconfig.base import check_plugin_options


def callback_class(name: str) -> type[Callback]:
    """The registered class of `name` (an entry point or a `module.path:Name`), checked to be a Callback."""
    cls = CALLBACKS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise ConfigError(
            f"callbacks.{name}: {cls!r} is not a Callback class (subclass core.callbacks.Callback)"
        )
    return cls


def check_callbacks(value: dict[str, Any]) -> dict[str, Any]:
    """Each named callback exists, is not a built-in, and its settings validate against its `Settings`."""
    for name, settings in value.items():
        cls = callback_class(name)
        if cls.section is not None:
            raise ConfigError(
                f"callbacks.{name}: always on; its settings are the `{cls.section}` section, not callbacks.{name}"
            )
        if cls.always:
            raise ConfigError(f"callbacks.{name}: always on and takes no settings; leave it out of callbacks")
        if settings is not None and not isinstance(settings, dict):
            raise ConfigError(f"callbacks.{name}: its settings are a mapping of keys, got {settings!r}")
        check_plugin_options(f"callbacks.{name}", "callback", name, cls.Settings, settings or {})
    return value


def callback_settings(name: str, settings: dict[str, Any] | None) -> Any:
    """The validated settings object of an outside callback (its `Settings` filled in), or None."""
    cls = callback_class(name)
    return None if cls.Settings is None else cls.Settings.model_validate(settings or {})
