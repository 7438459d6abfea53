"""The protocols every Ray role class implements: one small interface per kind of role (RLlib's EnvRunner /
Learner / LearnerGroup are the model), so that the driver, the supervisor and the telemetry speak to a runner, a
labeler, a learner or an engine of any family the same way.

Shared by all kinds:
- `stats() -> dict`: at least `pid` (a restarted role is a new incarnation) and `stage_s` (cumulative seconds per
  stage from a `StageClock`, read by `telemetry/stages.py`). The same word means the same idea in every family:
  `updates`, `policy_version`, `stored`, `labeled`, `env_steps`.
Per kind:
- **runner** (env runners, rollout runners, VLA rollout workers): `receive_weights(published) -> int`, the one way
  weights arrive (a `rlfarm.sync` publication; returns the version now held).
- **engine** (LLM engines, VLA inference servers): `receive_weights(published) -> int` as runners.
- **labeler** (reward labelers, scorers): `stats()`.
- **learner** (every learner, each rank of a data-parallel group): `publish()` (a publication for the receivers),
  `save(path, extra=None) -> str` (the file written) and `load(path) -> dict` (the `extra` saved with it).

`@role(kind)` checks a class against its kind's protocol when the module is imported (a missing method fails at
import, not an hour into a run) and registers it; `tests/roles/test_protocols.py` checks that every class this
package hands to `ray.remote` is registered."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Role(Protocol):
    def stats(self) -> dict: ...


@runtime_checkable
class ReceivesWeights(Role, Protocol):
    def receive_weights(self, published: Any) -> int: ...


@runtime_checkable
class Runner(ReceivesWeights, Protocol):
    pass


@runtime_checkable
class Engine(ReceivesWeights, Protocol):
    pass


@runtime_checkable
class Labeler(Role, Protocol):
    pass


@runtime_checkable
class Learner(Role, Protocol):
    def publish(self) -> Any: ...

    def save(self, path: str, extra: dict | None = None) -> str: ...

    def load(self, path: str) -> dict: ...


KINDS: dict[str, type] = {"runner": Runner, "engine": Engine, "labeler": Labeler, "learner": Learner}
REGISTERED: dict[type, str] = {}  # role class → its kind


def role(kind: str):
    """Class decorator: check the class against `KINDS[kind]` and register it. Raises TypeError naming the
    missing methods."""
    protocol = KINDS[kind]

    def register(cls: type) -> type:
        missing = [name for name in _members(protocol) if not callable(getattr(cls, name, None))]
        if missing:
            raise TypeError(f"{cls.__name__} is registered as a {kind} role but lacks {', '.join(missing)}")
        REGISTERED[cls] = kind
        return cls

    return register


def _members(protocol: type) -> list[str]:
    names = set()
    for base in protocol.__mro__:
        if base in (Protocol, object) or not getattr(base, "_is_protocol", False):
            continue
        names |= {name for name in vars(base) if not name.startswith("_")}
    return sorted(names)
