"""Every class rlfarm hands to `ray.remote` is a registered role that implements its kind's protocol
(rlfarm/roles/base.py): found by reading the package's source, so a new role class cannot slip past."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest

import rlfarm
from rlfarm.roles.base import KINDS, REGISTERED, role

PACKAGE = Path(rlfarm.__file__).parent
NOT_ROLES = {"Probe"}  # `rlfarm plan`'s placement probe: asks a GPU's id, never part of a run


def remote_classes() -> set[tuple[str, str]]:
    """(module, class name) of every `ray.remote(Name)` and `ray.remote(...)(Name)` in the package."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Call):  # ray.remote(options...)(Name)
                func, args = func.func, node.args
            else:
                args = node.args
            if isinstance(func, ast.Attribute) and func.attr == "remote" and getattr(func.value, "id", "") == "ray":
                found |= {(module, a.id) for a in args if isinstance(a, ast.Name) and a.id[:1].isupper()}
    return found


def test_every_remote_class_is_a_registered_role():
    classes = remote_classes()
    assert len(classes) >= 8, classes  # the finder itself works: the farm, the LLM, PPO and VLA roles at least
    unregistered = []
    for module, name in sorted(classes):
        if name in NOT_ROLES:
            continue
        cls = getattr(importlib.import_module(module), name)
        if cls not in REGISTERED:
            unregistered.append(f"{module}.{name}")
    assert not unregistered, f"not registered as a role (add @role(kind) from rlfarm.roles.base): {unregistered}"


def test_registered_roles_implement_their_protocol():
    for module, name in remote_classes():
        importlib.import_module(module)
    for cls, kind in REGISTERED.items():
        assert issubclass(cls, KINDS[kind]), (cls, kind)
        if kind == "learner":
            assert list(inspect.signature(cls.save).parameters)[:3] == ["self", "path", "extra"], cls


def test_a_class_missing_a_method_is_refused_at_import():
    class NoPublish:
        def stats(self):
            return {}

        def save(self, path, extra=None):
            return path

        def load(self, path):
            return {}

    with pytest.raises(TypeError, match="lacks publish"):
        role("learner")(NoPublish)
