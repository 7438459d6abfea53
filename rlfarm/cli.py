"""`rlfarm` entry point: `rlfarm <command> [hydra overrides]`; each command is a Hydra app over conf/.

The only thing read here by hand is the command word; everything after it belongs to Hydra
(overrides, -m/--multirun, --cfg, --help, --config-dir, hydra/launcher=...). Before Hydra runs, the config is
composed once, on the search path Hydra will use (rlfarm.config.search), to turn a bad override into one clear
line instead of a traceback. The current directory is importable, as under `python -m`: an env or reward module
of the user's own (env.id=<module>:<Id>, a `_target_`) beside the command is found, by Ray's workers too (Ray
puts the driver's directory on their path).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import logging
import os
import re
import sys
import threading

from rich.console import Console
from rich.markup import escape

import rlfarm.resolvers  # noqa: F401 - registers the rlfarm.* OmegaConf resolvers the Slurm launcher config uses
from rlfarm.errors import JobFailed, RlfarmError

# command → (module with `task(cfg)`, config name, one-line description)
COMMANDS = {
    "train": ("rlfarm.commands.train", "train", "train a policy: rlfarm train algo=sac env=pendulum topology=local"),
    "plan": ("rlfarm.commands.plan", "train", "show where each role goes: rlfarm plan topology=split_1_3"),
    "eval": ("rlfarm.commands.eval", "eval", "play a trained policy, write returns and videos: rlfarm eval run_dir=<run>"),
    "report": ("rlfarm.commands.report", "report", "plot a run or a sweep: rlfarm report path=<run or multirun dir>"),
    "fit-reward": ("rlfarm.commands.fit_reward", "fit_reward",
                   "fit a reward model to frames: rlfarm fit-reward env=pendulum (then reward=model reward.model=...)"),
    "bench": ("rlfarm.commands.bench", "bench", "measure a stage next to its baseline: rlfarm bench learner|labeler|engine|sync|pipeline"),
}
# Config groups of conf/ that no run picks (other commands' options, the schemas): left out of `--help`'s list.
INTERNAL_GROUPS = {"train": ("bench", "net", "schema"), "plan": ("bench", "net", "schema")}
HYDRA_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--shell-completion", "-sc"}

err = Console(stderr=True, highlight=False, soft_wrap=True)

# Before torch is first imported: torch scans every installed package's entry points for out-of-tree device
# backends (Ascend, HPU, ...) on import, ~0.3 CPU-s per process; rlfarm runs on CPU and CUDA, which are built in.
# A private Ray cluster's workers inherit it from the driver. Set it to 1 to load such a backend.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def usage() -> str:
    lines = ["usage: rlfarm <command> [key=value ...] [-m]", "", "commands:"]
    lines += [f"  {name:<10} {desc}" for name, (_, _, desc) in COMMANDS.items()]
    lines += ["", "Each command takes Hydra overrides; `rlfarm <command> --help` lists its config groups."]
    return "\n".join(lines)


def fail(error: RlfarmError | str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {escape(str(error))}", markup=True)  # "[n, 1]" in a message is not markup
    if os.environ.get("SUBMITIT_FOLDER") and code != 75:
        # Inside a submitit (Slurm sweep) job, SystemExit ends the job without a result file, and the sweep
        # command, where Slurm has no accounting, waits for it forever. An exception becomes the job's result.
        raise JobFailed(str(error))
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"unknown command '{command}' — commands are: {', '.join(COMMANDS)}")
    module_name, config_name, _ = COMMANDS[command]
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # after the installed packages: a file here named like one does not shadow it
    module = importlib.import_module(module_name)
    rest = [integral_numbers(arg) for arg in rest]
    if hasattr(module, "redirect_resume"):
        rest = module.redirect_resume(rest)
    if hasattr(module, "rewrite_args"):  # e.g. `rlfarm bench learner` → bench=learner
        rest = module.rewrite_args(rest)
    from rlfarm.config import use_command_line

    try:
        use_command_line(rest)
    except RlfarmError as error:
        fail(error)
    try:
        if not HYDRA_INFO_FLAGS & set(rest):
            try:
                module.preflight(config_name, rest)
            except RlfarmError as error:
                fail(error)
        run_hydra_app(module.task, config_name, command, rest)
    except KeyboardInterrupt:  # Ctrl-C before a run's loop handles it (start-up): one line, not a traceback
        fail("interrupted", code=130)


E_NOTATION = re.compile(r"[+]?\d+(\.\d*)?[eE]\+?\d+")


def integral_numbers(arg: str) -> str:
    """`total_env_steps=1e6` as `total_env_steps=1000000`: Hydra reads e-notation as a float, which an integer key
    refuses; a whole number so written is meant as one (each value of a sweep's `a,b` too)."""
    key, equals, value = arg.partition("=")
    if not equals or arg.startswith("-"):
        return arg
    values = value.split(",")
    if not all(E_NOTATION.fullmatch(v) and float(v).is_integer() for v in values):
        return arg
    return f"{key}={','.join(str(int(float(v))) for v in values)}"


def run_hydra_app(task, config_name: str, command: str, args: list[str]) -> None:
    import hydra

    from rlfarm.config import CONF_DIR

    sys.argv = [f"rlfarm {command}", *args]
    app = hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")(task)
    if not {"--help", "-h"} & set(args) or command not in INTERNAL_GROUPS:
        app()
        return
    shown, code = io.StringIO(), 0
    with contextlib.redirect_stdout(shown):
        try:
            app()
        except SystemExit as done:  # Hydra exits after the help
            code = done.code
    print(without_groups(shown.getvalue(), INTERNAL_GROUPS[command]), end="")
    raise SystemExit(code)


def without_groups(help_text: str, groups: tuple[str, ...]) -> str:
    """Hydra's help less the lines listing `groups` (and their subgroups: `schema/algo: ...`)."""
    return "".join(line for line in help_text.splitlines(keepends=True)
                   if not line.split(":", 1)[0].split("/", 1)[0] in groups or ":" not in line)


def run() -> None:
    """The `rlfarm` command (console script, `python -m rlfarm.cli`): `main`, then leave as Python would — threads
    joined, atexit handlers run, logs and output flushed — but without tearing down the interpreter's modules, which
    takes a run's driver ~2 CPU-s once torch, Ray and Hydra are loaded (its run is over by then: Ray shut down,
    run directory closed). `main` itself raises SystemExit as before, for callers in a process of their own."""
    try:
        main()
        code = 0
    except SystemExit as done:
        code = exit_code(done)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 - what the interpreter runs at exit; os._exit would skip them
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_code(done: SystemExit) -> int:
    """The process's exit status for SystemExit(done.code), as Python sets it (a message is printed, status 1)."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    run()
