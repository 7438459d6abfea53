"""Bad input gets a clear error and loses nothing (issue 5).

Every row is something a user might type. `rlfarm` must refuse it with exit code 2 and exactly one line on
stderr that names the problem and its fix, and leave no run directory behind: nothing is created before the
input is known to be good. Most rows run `rlfarm.cli.main` in this process (the same preflight and the same
`fail` as the command; Hydra's app is replaced by a test failure, so nothing can start). A few run `rlfarm` in a
subprocess, as a user runs it, and must also be quick: 5 s on an idle machine, 15 s asserted because CI shares
its cores. Each subprocess is a cold import of Hydra, gymnasium (and torch for a `_target_`): seconds each.
"""
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from omegaconf import OmegaConf

from helpers import rlfarm
from rlfarm import cli
from rlfarm.cluster import cluster_address, ray_session
from rlfarm.errors import ConfigError
from rlfarm.families import OFFPOLICY
from rlfarm.topology import plan_topology

LOCAL_PLAN = plan_topology({"name": "tiny", "roles": {role: {"count": 1, "cpus": 0.1}
                                                     for role in ("learner", "env_runner", "labeler")}}, OFFPOLICY)


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


NEEDS_FEWER_THAN_4_GPUS = pytest.mark.skipif(_gpu_count() >= 4, reason="this machine can hold split_1_3")

# (args, distinctive part of the one line). "{tmp}" is the test's own temporary folder.
CASES = [
    # unknown config-group option: the choices are listed
    pytest.param(["train", "algo=nope"], "unknown algo 'nope' — choose one of: ", id="unknown-algo"),
    pytest.param(["train", "env=halfcheetha"], "did you mean env=halfcheetah?", id="unknown-env"),
    pytest.param(["train", "reward=nope"], "unknown reward 'nope'", id="unknown-reward"),
    pytest.param(["train", "topology=split_9_9"], "unknown topology 'split_9_9'", id="unknown-topology"),
    pytest.param(["train", "model=cnn"], "unknown model 'cnn' — choose one of: ", id="unknown-model"),
    pytest.param(["train", "logger=nonee"], "did you mean logger=none?", id="unknown-logger"),
    # unknown keys
    pytest.param(["train", "nope_key=1"], "unknown config key 'nope_key'", id="unknown-top-level-key"),
    pytest.param(["train", "algo.lrr=1e-3"], "unknown config key 'algo.lrr' — did you mean algo.lr?",
                 id="unknown-nested-key"),
    pytest.param(["train", "+algo.lr=1e-3"], "drop the '+': algo.lr=", id="plus-on-existing-key"),
    pytest.param(["train", "+algo=sac"], "drop the '+': algo=", id="plus-on-chosen-group"),
    pytest.param(["train", "+env=cartpole"], "drop the '+': env=", id="plus-on-another-group-option"),
    # keys added with '+' that nothing reads: a schema's field, a _target_'s argument or a group's own key is
    # named instead (a new top-level key is the user's note, unless it is a near miss of a setting)
    pytest.param(["train", "+algo.bogus=1"], "unknown key 'algo.bogus': nothing reads it — the keys of algo are "
                 "actor_lr, agent, batch_size", id="plus-key-unknown-to-the-algo-schema"),
    pytest.param(["train", "+run.typo=3"], "unknown key 'run.typo': nothing reads it — the keys of run are",
                 id="plus-key-unknown-to-the-run-schema"),
    pytest.param(["train", "+env.kwargz={}"], "unknown key 'env.kwargz': nothing reads it — did you mean env.kwargs?",
                 id="plus-key-typo-in-the-env-schema"),
    pytest.param(["train", "+algo.agent.gama=0.9"], "unknown key 'algo.agent.gama': nothing reads it — did you mean "
                 "algo.agent.gamma?", id="plus-key-not-an-argument-of-the-target"),
    pytest.param(["train", "reward=model", "reward.module._target_=rlfarm.rewards.model.BrightnessReward",
                  "+reward.module.scal=2"], "did you mean reward.module.scale?",
                 id="plus-key-not-an-argument-of-the-reward-module"),
    pytest.param(["train", "+topology.roles.learner.cpuss=1"], "did you mean topology.roles.learner.cpus?",
                 id="plus-key-unknown-to-the-topology"),
    pytest.param(["train", "experiment=grpo_digits", "+env.num_digitz=5"], "did you mean env.num_digits?",
                 id="plus-key-unknown-to-a-group-without-schema"),
    pytest.param(["train", "+seeds=3"], "unknown key 'seeds': nothing reads it — did you mean seed?",
                 id="plus-top-level-near-miss"),
    # wrong types
    pytest.param(["train", "algo.lr=abc"], "algo.lr must be a number, got 'abc'", id="lr-not-a-number"),
    pytest.param(["train", "total_env_steps=ten"], "total_env_steps must be an integer", id="steps-a-word"),
    pytest.param(["train", "seed=1.5"], "seed must be an integer, got 1.5", id="seed-fractional"),
    pytest.param(["train", "algo.batch_size=[1]"], "algo.batch_size must be an integer, got [1]",
                 id="batch-size-a-list"),
    pytest.param(["train", "run.live=maybe"], "run.live must be one of auto|true|false", id="live-not-a-choice"),
    pytest.param(["train", "ray.num_cpus=abc"], "ray.num_cpus must be a number", id="ray-cpus-a-word"),
    # zero or negative counts
    pytest.param(["train", "total_env_steps=-1"], "total_env_steps must be > 0, got -1", id="steps-negative"),
    pytest.param(["train", "total_env_steps=0"], "total_env_steps must be > 0, got 0", id="steps-zero"),
    pytest.param(["train", "algo.batch_size=0"], "algo.batch_size must be > 0", id="batch-size-zero"),
    pytest.param(["train", "algo.credits=0"], "algo.credits must be > 0", id="credits-zero"),
    pytest.param(["train", "env.num_envs=0"], "env.num_envs must be > 0", id="num-envs-zero"),
    pytest.param(["train", "labeler.bus_items=0"], "labeler.bus_items must be > 0", id="bus-items-zero"),
    pytest.param(["train", "run.max_wall_s=-5"], "run.max_wall_s must be > 0", id="max-wall-negative"),
    pytest.param(["train", "run.max_restarts=-1"], "run.max_restarts must be >= 0", id="max-restarts-negative"),
    pytest.param(["train", "topology.roles.env_runner.count=-1"], "topology.roles.env_runner.count must be",
                 id="runner-count-negative"),
    pytest.param(["train", "topology.roles.labeler.count=0"], "topology.roles.labeler.count must be at least 1",
                 id="labeler-count-zero"),
    # a cluster that is not there: a probe of ray.address (gRPC handshake) fails in seconds; Ray retries ~80 s
    pytest.param(["train", "ray.address=127.0.0.1:1"], "no Ray cluster answers at ray.address=127.0.0.1:1: connection "
                 "refused — start the cluster there with `ray start --head", id="ray-address-nothing-listens"),
    pytest.param(["plan", "ray.address=127.0.0.1:1"], "no Ray cluster answers at ray.address=127.0.0.1:1",
                 id="plan-ray-address-nothing-listens"),
    pytest.param(["train", "ray.address=ray://127.0.0.1:1"], "no Ray cluster answers at ray.address=ray://127.0.0.1:1",
                 id="ray-client-address-nothing-listens"),
    pytest.param(["train", "ray.address=auto"], "no Ray cluster answers at 127.0.0.1:1 (ray.address=auto)",
                 id="ray-address-auto-nothing-listens"),  # RAY_ADDRESS=127.0.0.1:1 (ROW_ENV)
    pytest.param(["train", "ray.address=localhost"], "ray.address=localhost is not host:port — set ray.address=",
                 id="ray-address-without-port"),
    # a topology the cluster cannot hold: fails before Ray starts instead of waiting forever
    pytest.param(["train", "topology=split_1_3"], "needs 4 GPUs but the cluster has", id="gpus-beyond-cluster",
                 marks=NEEDS_FEWER_THAN_4_GPUS),
    pytest.param(["plan", "topology=split_1_3"], "needs 4 GPUs but the cluster has", id="plan-gpus-beyond-cluster",
                 marks=NEEDS_FEWER_THAN_4_GPUS),
    pytest.param(["train", "topology.roles.env_runner.count=4096"], "CPUs but the cluster has",
                 id="cpus-beyond-cluster"),
    pytest.param(["train", "topology.roles.learner.gpus=1.5"], "a share above 1 GPU must be whole", id="gpu-share-1.5"),
    # mandatory values and the things they name
    pytest.param(["train", "reward=clip"], "reward.model is required but not set", id="clip-without-model"),
    # paths (rlfarm.schemas.PATH_SETTINGS): blank, missing, the wrong kind of thing
    pytest.param(["train", "reward=clip", "reward.model="], "reward.model: blank ('') — set reward.model=<",
                 id="clip-model-blank"),
    pytest.param(["train", "reward=clip", "reward.model=/nonexistent/clip"],
                 "reward.model: no such folder '/nonexistent/clip'", id="clip-model-path-missing"),
    pytest.param(["train", "reward=clip", "reward.model=models/vit/clip"], "reward.model: no such folder "
                 "'models/vit/clip'", id="clip-model-relative-path-missing"),  # two '/': no hub id
    pytest.param(["train", "reward=clip", "reward.model={tmp}/a_file"], "/a_file' is a file, not a model folder",
                 id="clip-model-a-file"),
    pytest.param(["train", "reward=clip", "reward.model={tmp}/empty_dir"],
                 "/empty_dir' has no config.json (not a folder written by save_pretrained)", id="clip-model-empty-folder"),
    pytest.param(["train", "reward=model", "reward.checkpoint={tmp}/no_such.pt"], "reward.checkpoint: no such file",
                 id="reward-checkpoint-missing"),
    pytest.param(["train", "reward=model", "reward.checkpoint={tmp}/empty_dir"], "/empty_dir' is a folder, not a file",
                 id="reward-checkpoint-a-folder"),
    pytest.param(["train", "reward=model", "reward.checkpoint={tmp}/empty.pt"], "/empty.pt' is an empty file",
                 id="reward-checkpoint-empty-file"),
    pytest.param(["train", "reward=model", "reward.checkpoint={tmp}/a_file"], "/a_file is not a TorchScript file",
                 id="reward-checkpoint-not-torchscript"),
    pytest.param(["train", "experiment=grpo_prompts", "model.source={tmp}/a_file", "env.path={tmp}/a_file"],
                 "model.source: '{tmp}/a_file' is a file, not a model folder", id="lm-source-a-file"),
    pytest.param(["train", "experiment=grpo_prompts", "model.source=Qwen/Qwen2.5-0.5B", "env.path="],
                 "env.path: blank ('') — set env.path=<a .jsonl or .parquet file", id="prompt-file-blank"),
    pytest.param(["train", "experiment=grpo_prompts", "model.source=Qwen/Qwen2.5-0.5B", "env.path={tmp}/empty_dir"],
                 "env.path: '{tmp}/empty_dir' is a folder, not a file", id="prompt-file-a-folder"),
    pytest.param(["train", "experiment=grpo_prompts", "model.source=Qwen/Qwen2.5-0.5B", "env.path={tmp}/empty.pt"],
                 "env.path: '{tmp}/empty.pt' is an empty file", id="prompt-file-empty"),
    pytest.param(["train", "experiment=simplevla", "model=hf_vla", "model.source={tmp}/a_file"],
                 "model.source: '{tmp}/a_file' is a file, not a model folder", id="vla-source-a-file"),
    pytest.param(["train", "resume="], "resume= is not a run directory", id="resume-blank"),
    # on-policy layouts: a step that does not split across the engines; overlap asked of time-shared engines
    pytest.param(["train", "experiment=grpo_digits", "topology.roles.engine.count=3", "ray.num_cpus=4"],
                 "algo.prompts_per_step=32 does not split across 3 engines", id="prompts-across-engines"),
    pytest.param(["train", "experiment=grpo_digits", "topology=colocated", "ray.num_gpus=1", "algo.max_staleness=1"],
                 "algo.max_staleness=1 needs engines on GPUs of their own", id="async-on-a-time-shared-gpu"),
    pytest.param(["train", "experiment=grpo_digits", "algo.max_staleness=-1"], "algo.max_staleness", id="negative-staleness"),
    pytest.param(["eval", "run_dir="], "'' is not a run directory", id="eval-run-dir-blank"),
    pytest.param(["report", "path="], "no run under ''", id="report-path-blank"),
    pytest.param(["train", "env.id=HalfCheeta-v5"], "did you mean HalfCheetah-v5", id="env-id-typo"),
    pytest.param(["train", "reward._target_=nope.Nope"], "reward._target_='nope.Nope' cannot be imported",
                 id="reward-target-unknown-module"),
    pytest.param(["train", "reward._target_=rlfarm.rewards.env.EnvRewad"],
                 "did you mean rlfarm.rewards.env.EnvReward?", id="reward-target-typo"),
    # override syntax
    pytest.param(["train", "algo.lr="], "algo.lr must be a number, got ''", id="empty-value"),
    pytest.param(["train", "algo.lr=[1,"], "cannot parse override 'algo.lr=[1,'", id="unclosed-list"),
    pytest.param(["train", "algo"], "cannot parse override 'algo': no '=' in it", id="no-equals-sign"),
    pytest.param(["train", "-m", "algo=sac,nope"], "unknown algo 'nope'", id="sweep-with-bad-choice"),
    pytest.param(["frobnicate"], "unknown command 'frobnicate' — commands are: train", id="unknown-command"),
    # where the run would be written
    pytest.param(["train", "hydra.run.dir=/proc/forbidden/run"], "cannot create hydra.run.dir=/proc/forbidden/run",
                 id="run-dir-unwritable"),
    pytest.param(["train", "hydra.run.dir={tmp}/a_file/run"], "is a file, not a folder", id="run-dir-under-a-file"),
    pytest.param(["train", "-m", "seed=1,2", "hydra.sweep.dir=/proc/forbidden"],
                 "cannot create hydra.sweep.dir=/proc/forbidden", id="sweep-dir-unwritable"),
    pytest.param(["train", "resume=/not/a/run_dir"], "/not/a/run_dir", id="resume-not-a-run-dir"),
    # PPO on gymnasium envs (the ppo family): choices it cannot take, and its own keys
    pytest.param(["train", "algo=ppo", "reward=model"], "algo=ppo learns from the env's own reward",
                 id="ppo-with-a-reward-model"),
    pytest.param(["train", "algo=ppo", "model=mlp"], "algo=ppo needs one actor-critic network in model.actor",
                 id="ppo-with-sac-networks"),
    pytest.param(["train", "algo=ppo", "env=digits"], "algo=ppo runs on gymnasium envs, but env.id=digits is a text",
                 id="ppo-on-a-text-task"),
    pytest.param(["train", "algo=ppo", "topology=local_llm"], "topology 'local_llm' has no role 'env_runner'",
                 id="ppo-topology-without-runners"),
    pytest.param(["train", "algo=ppo", "algo.epochs=0"], "algo.epochs must be > 0, got 0", id="ppo-epochs-zero"),
    pytest.param(["train", "algo=ppo", "algo.gamma=1.5"], "algo.gamma must be in [0, 1], got 1.5", id="ppo-gamma-above-1"),
    pytest.param(["train", "algo=ppo", "algo.minibatches=1000"], "more than the 32 transitions a runner collects",
                 id="ppo-more-minibatches-than-samples"),
    pytest.param(["train", "algo=ppo", "algo.target_return=high"], "algo.target_return must be a number or null",
                 id="ppo-target-a-word"),
    # IMPALA / APPO (the farm's data path, V-trace at the learner)
    pytest.param(["train", "algo=impala", "env=cartpole", "algo.batch_chunks=5"],
                 "algo.batch_chunks=5 is more than the 2 chunks the runners can have in flight",
                 id="impala-batch-the-credits-cannot-fill"),
    pytest.param(["train", "algo=appo", "env=cartpole", "model=mlp"], "algo=appo needs one actor-critic network",
                 id="appo-with-sac-networks"),
    pytest.param(["train", "topology.roles.learner.count=2"], "algo=sac has one learner, but topology.roles.learner.count=2",
                 id="sac-with-learner-ranks"),
    pytest.param(["train", "algo=impala", "env=cartpole", "topology.roles.learner.count=2"],
                 "2 learner ranks need at least as many env runners", id="impala-more-ranks-than-runners"),
    pytest.param(["train", "algo=appo", "env=cartpole", "env.groups=3", "env.num_envs=8", "env.workers=2"],
                 "groups", id="groups-not-dividing-workers"),
    pytest.param(["train", "algo=impala", "env=cartpole", "algo.target_update_every=4"],
                 "algo.target_update_every anchors APPO's clip", id="impala-with-a-target-network"),
    pytest.param(["train", "algo=impala", "algo.loss=vtrace"], "algo.loss must be one of impala|appo",
                 id="impala-unknown-loss"),
    pytest.param(["train", "algo=appo", "env=atari", "model=cnn_actor_critic", "env.kwargs.game=Pongg"],
                 "unknown Atari game 'Pongg' (closest: Pong", id="atari-unknown-game"),
    pytest.param(["train", "algo=appo", "env.id=rlfarm.nope:Thing-v0"], "env.id=rlfarm.nope:Thing-v0: cannot import",
                 id="env-id-module-missing"),
    # mistakes only building things finds (rlfarm/config/probes.py), found in the driver before any role starts
    pytest.param(["train", "env=cartpole"], "algo=sac learns a squashed-Gaussian policy and Q(s, a): continuous (Box) "
                 "actions only, but CartPole-v1 has discrete actions (Discrete(2)) — use algo=ppo|impala|appo",
                 id="sac-on-discrete-actions"),
    pytest.param(["train", "reward=model"], "reward=model names no reward model — set reward.module._target_=",
                 id="reward-model-without-a-model"),
    pytest.param(["train", "reward=model", "reward.module._target_=rlfarm.rewards.model.BrightnessReward",
                  "+reward.module.scale=abc"], "reward.module: rlfarm.rewards.model.BrightnessReward cannot be built: "
                 "ValueError: could not convert string to float: 'abc'", id="reward-module-constructor-raises"),
    # reward=distilled: the teacher's keys under reward.teacher, the student's settings checked by their ranges
    pytest.param(["train", "reward=distilled"], "reward.teacher.model is required but not set",
                 id="distilled-without-a-teacher-model"),
    pytest.param(["train", "reward=distilled", "reward.teacher.model=tiny_shape", "reward.teacher_fraction=1.5"],
                 "reward.teacher_fraction must be in (0, 1], got 1.5 — set reward.teacher_fraction to a value in (0, 1]",
                 id="distilled-teacher-fraction-out-of-range"),
    pytest.param(["train", "reward=distilled", "reward.teacher.model=/nonexistent/judge"],
                 "reward.teacher.model: no such folder '/nonexistent/judge'", id="distilled-teacher-model-missing"),
    pytest.param(["train", "reward=distilled", "reward.teacher.model=tiny_shape", "reward.teacher.score=logit"],
                 "reward.teacher.score='logit' is not a judge score — set reward.teacher.score=log_odds or p_yes",
                 id="distilled-teacher-setting-bad"),
    pytest.param(["train", "algo=ppo", "env=pendulum", "model.actor.hidden=[-3]"],
                 "model.actor (rlfarm.models.actor_critic.ActorCritic) cannot be built for Pendulum-v1: RuntimeError",
                 id="policy-constructor-raises"),
    # GRPO on text (the llm family)
    pytest.param(["train", "experiment=grpo_digits", "reward.verifier=exactmatch"], "unknown reward.verifier 'exactmatch'",
                 id="grpo-unknown-verifier"),
    pytest.param(["train", "experiment=grpo_digits", "algo.weight_sync=nccl"],
                 "algo.weight_sync must be one of auto|object_store|broadcast|ipc", id="grpo-unknown-weight-sync"),
    pytest.param(["train", "experiment=grpo_digits", "algo.data_parallel=zero3"],
                 "algo.data_parallel must be one of ddp|fsdp", id="grpo-unknown-data-parallel"),
    pytest.param(["train", "experiment=grpo_long_tail", "topology=local_llm", "model.vocab=all"],
                 "model.vocab must be task or shape, got 'all'", id="grpo-unknown-vocab"),
    pytest.param(["train", "experiment=grpo_digits", "algo.is_correction=tis"],
                 "algo.is_correction must be one of auto|none|token_tis|seq_tis", id="grpo-unknown-is-correction"),
    pytest.param(["train", "experiment=grpo_digits", "algo.is_cap=0.5"], "algo.is_cap must be >= 1",
                 id="grpo-is-cap-below-one"),
    pytest.param(["train", "experiment=grpo_digits", "algo.synthetic_lengths={median_frac:0.5,p99_frac:0.4}"],
                 "is not a length model", id="grpo-synthetic-lengths-out-of-order"),
    pytest.param(["train", "experiment=ppo_lm_digits", "topology=split_2_1"],
                 "algo.advantage=gae trains its critic on one learner rank", id="ppo-lm-data-parallel"),
    pytest.param(["train", "experiment=grpo_digits", "algo.weight_sync=ipc"],
                 "algo.weight_sync=ipc needs the learner and the engine on one GPU", id="grpo-ipc-apart"),
    # NVIDIA MPS (rlfarm/mps.py): only for a private local cluster, and only where the driver's program is
    pytest.param(["train", "topology.mps=true", "ray.address=127.0.0.1:9"],
                 "topology.mps=true starts an MPS daemon for a private local cluster, not for one joined at",
                 id="mps-on-a-joined-cluster"),
    pytest.param(["train", "topology.mps=true"], "needs NVIDIA's MPS control program (nvidia-cuda-mps-control)",
                 id="mps-without-the-driver", marks=pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is not None,
                                                                      reason="this machine has MPS")),
    pytest.param(["train", "experiment=grpo_digits", "topology.mps=true"],
                 "algo.family=llm has no role that would use it", id="mps-without-labelers"),
    pytest.param(["plan", "experiment=grpo_digits", "topology.mps=true"],
                 "algo.family=llm has no role that would use it", id="plan-mps-without-labelers"),
    # VLA family
    pytest.param(["train", "experiment=simplevla", "model=hf_vla", "model.source={tmp}/no-llava"],
                 "model.source: no such folder", id="vla-checkpoint-missing"),
    pytest.param(["train", "experiment=simplevla", "model=mlp"], "algo=grpo_vla needs a VLA policy",
                 id="vla-with-sac-networks"),
    pytest.param(["train", "experiment=ppo_vla", "algo.critic=both"], "algo.critic must be one of shared|separate",
                 id="ppo-vla-critic-choice"),
    pytest.param(["train", "experiment=ppo_vla", "algo.value_coef=-1"], "algo.value_coef must be >= 0",
                 id="ppo-vla-value-coef"),
    pytest.param(["train", "experiment=simplevla", "algo.server_dtype=bf16"],
                 "algo.server_dtype must be one of auto|float32|bfloat16", id="vla-server-dtype"),
    # a learned reward: a file that fit-reward did not write; fit-reward's own options
    pytest.param(["train", "reward=model", "reward.model={tmp}/a_file"], "reward.model: cannot read fitted reward",
                 id="fitted-reward-not-a-fitted-file"),
    pytest.param(["train", "reward=model", "reward.model={tmp}/empty_dir"], "'{tmp}/empty_dir' is a folder, not a file",
                 id="fitted-reward-a-folder"),
    pytest.param(["fit-reward", "target=file"], "target=file needs labels=<file.npz>", id="fit-file-without-labels"),
    pytest.param(["fit-reward", "target=rewards"], "target must be one of env_reward|success|file", id="fit-unknown-target"),
    pytest.param(["fit-reward", "policy={tmp}/empty_dir"], "policy: '{tmp}/empty_dir' is not a run directory",
                 id="fit-policy-not-a-run"),
    pytest.param(["fit-reward", "env.id=Pendulm-v1"], "unknown env id 'Pendulm-v1' — did you mean Pendulum-v1",
                 id="fit-unknown-env"),
    pytest.param(["fit-reward", "fit.holdout=1.5"], "holdout must be in (0, 1), got 1.5", id="fit-holdout-range"),
    pytest.param(["fit-reward", "net=goal_baseline"], "net.tower is required", id="fit-tower-missing"),
    pytest.param(["fit-reward", "net=goal_baseline", "net.tower={tmp}/empty_dir"], "has no config.json",
                 id="fit-tower-not-a-model"),
]


# Rows that also run as a subprocess: a bad choice, an unknown key, a `_target_` typo (its module is imported:
# torch), a topology bigger than this machine (the cluster check), a cluster address where nothing listens.
SUBPROCESS_ROWS = {"unknown-env", "unknown-top-level-key", "reward-target-typo", "gpus-beyond-cluster",
                   "ray-address-nothing-listens", "fit-file-without-labels", "sac-on-discrete-actions"}
# Environment a row runs in: `auto` finds its address in RAY_ADDRESS before it looks for a local cluster (other
# Ray sessions on this machine would be found), so the row names one where nothing listens.
ROW_ENV = {"ray-address-auto-nothing-listens": {"RAY_ADDRESS": "127.0.0.1:1"}}
IN_PROCESS = [case for case in CASES if case.id not in SUBPROCESS_ROWS]
IN_SUBPROCESS = [case for case in CASES if case.id in SUBPROCESS_ROWS]


def command_line(args: list[str], tmp_path) -> list[str]:
    """The row's arguments, with Hydra's run and sweep folders inside tmp_path (where the test looks for them)."""
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "empty.pt").touch()
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] in ("train", "plan", "fit-reward"):
        args += [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]
        args = [a for i, a in enumerate(args) if a.split("=")[0] not in {b.split("=")[0] for b in args[:i]}]
    return args


def assert_one_clear_line(stdout: str, stderr: str, needle: str) -> None:
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and not stdout.strip(), (stdout + stderr)[-2000:]
    assert lines[0].startswith("error: ") and " — " in lines[0], lines[0]  # problem — fix
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args, needle", IN_PROCESS)
def test_bad_input_is_refused_before_hydra_runs(request, tmp_path, monkeypatch, capsys, args, needle):
    args, needle = command_line(args, tmp_path), needle.replace("{tmp}", str(tmp_path))
    before = set(tmp_path.iterdir())
    monkeypatch.chdir(tmp_path)
    for name, value in ROW_ENV.get(request.node.callspec.id, {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "run_hydra_app", lambda *_: pytest.fail("the preflight let this through"))
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert_one_clear_line(captured.out, captured.err, needle)
    assert set(tmp_path.iterdir()) == before, sorted(p.name for p in set(tmp_path.iterdir()) - before)


@pytest.mark.parametrize("args, needle", IN_SUBPROCESS)
def test_bad_input_is_one_clear_line_and_leaves_nothing(tmp_path, args, needle):
    args = command_line(args, tmp_path)
    before = set(tmp_path.iterdir())
    out = rlfarm(*args, cwd=tmp_path, timeout=120)

    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert_one_clear_line(out.stdout, out.stderr, needle)
    # refused before any role: Ray was never started (how fast is the bench's business, not a test's)
    assert "starting Ray" not in out.stdout + out.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    assert set(tmp_path.iterdir()) == before, sorted(p.name for p in set(tmp_path.iterdir()) - before)


@pytest.mark.parametrize("args", [
    pytest.param(["+note=baseline"], id="top-level-note"),
    pytest.param(["+env.kwargs.max_episode_steps=50"], id="free-form-env-kwargs"),
    pytest.param(["+topology.pools.spare.gpus=0"], id="pool-of-ones-own"),
    pytest.param(["algo.agent._target_=rlfarm.algos.stalling.StallingAgent", "+algo.agent.stall_at=5"],
                 id="argument-of-a-target-with-kwargs"),
    pytest.param(["reward=clip", "reward.model=openai/clip-vit-base-patch16"], id="hub-id"),
])
def test_what_something_reads_passes_the_preflight(tmp_path, monkeypatch, args):
    """The other side of the table: keys and paths that are right must not be refused."""
    started = []
    monkeypatch.setattr(cli, "run_hydra_app", lambda *_: started.append(True))
    cli.main(command_line(["train", *args], tmp_path))
    assert started


def test_ray_session_on_an_address_where_nothing_listens_fails_without_starting_ray():
    """Inside a Slurm job (no preflight ran there) the run's own Ray session checks the address the same way."""
    import ray

    cfg = OmegaConf.create({"address": "127.0.0.1:1", "num_cpus": None, "num_gpus": None, "dashboard": False})
    with pytest.raises(ConfigError, match="no Ray cluster answers at ray.address=127.0.0.1:1"):
        with ray_session(cfg, LOCAL_PLAN):
            pytest.fail("joined a cluster that is not there")
    assert not ray.is_initialized()


def test_the_address_probe_tells_a_ray_gcs_from_another_server():
    """A typo'd port may hit another server (the dashboard's HTTP port): ray.init would wait there for minutes."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ConfigError, match="something listens there, but it is not a Ray GCS"):
            cluster_address(f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    local = OmegaConf.create({"address": None, "num_cpus": 1, "num_gpus": 0, "dashboard": False})
    with ray_session(local, LOCAL_PLAN) as ray:
        gcs = ray.get_runtime_context().gcs_address
        assert cluster_address(gcs) == gcs
