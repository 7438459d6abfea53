"""Imported once by the tests' driver server (tests/driver_server.py) before it forks each `rlfarm` command: what
every run's driver imports (torch through the loops and roles, Ray, Hydra, rich). Nothing here may start a thread,
a process or a connection, or read the environment that a command sets for itself."""
import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # as rlfarm/cli.py sets it, before torch loads

import hydra  # noqa: E402,F401
import ray  # noqa: E402,F401
import torch  # noqa: E402,F401

import rlfarm.cli  # noqa: E402,F401
import rlfarm.commands.train  # noqa: E402,F401
import rlfarm.loops.llm  # noqa: E402,F401
import rlfarm.loops.offpolicy  # noqa: E402,F401
import rlfarm.loops.ppo  # noqa: E402,F401
import rlfarm.loops.vla  # noqa: E402,F401
