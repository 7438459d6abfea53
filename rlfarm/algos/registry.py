"""Advantage estimators by name, as verl's `register_adv_est`: a config says `advantage: grpo` and the
loop looks the function up here. Estimators take different inputs (GAE needs values, GRPO needs groups),
so callers pass keyword arguments; the registry only maps names to functions.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

_ADVANTAGES: dict[str, Callable] = {}

# Modules whose import registers estimators; imported on first lookup so a caller needs only this module.
_ESTIMATOR_MODULES = ("rlfarm.algos.grpo", "rlfarm.algos.ppo")


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Decorator: make `fn` available as `get_advantage(name)`. A name is registered once."""
    def decorate(fn: Callable) -> Callable:
        if name in _ADVANTAGES and _ADVANTAGES[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ADVANTAGES[name] = fn
        return fn
    return decorate


def get_advantage(name: str) -> Callable:
    for module in _ESTIMATOR_MODULES:
        importlib.import_module(module)
    if name not in _ADVANTAGES:
        raise KeyError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(_ADVANTAGES))}")
    return _ADVANTAGES[name]
