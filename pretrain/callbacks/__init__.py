"""The built-in callbacks of a training run (core/callbacks.py: the contract; the runner the loop calls is
pretrain/run/callback_runner.py).

Each module is one callback, registered in pyproject.toml's `lmstack.callbacks` group like an outside one; its
settings are the run config's section it names (`watchdog`, `spikes`, `eval`, `logging`). Their modules import
torch inside the hooks only: the config loader and the reference read their settings without it.
"""
