"""The env stage alone, for the actor-learner figures: P processes each step a VectorEnv of N sub-envs with random
actions (no policy, no Ray) for D seconds; prints the total env steps/s as JSON.
usage: python3 launch/device/env_alone.py ENV_ID PROCESSES NUM_ENVS SECONDS [key=value env kwargs ...]"""
import json
import multiprocessing as mp
import sys
import time

import numpy as np


def work(args):
    env_id, num_envs, seconds, kwargs, seed = args
    from rlfarm.envs.vector import VectorEnv

    env = VectorEnv(env_id, num_envs, seed, None, kwargs)
    rows = env.step_buffers(1)
    env.reset_into(rows)
    rng, steps, started = np.random.default_rng(seed), 0, time.perf_counter()
    n = env.single_action_space.n
    while time.perf_counter() - started < seconds:
        rows.action[0] = rng.integers(0, n, num_envs)
        env.step_into(rows, 0)
        rows.obs[0] = rows.obs[1]
        steps += num_envs
    env.close()
    return steps / (time.perf_counter() - started)


if __name__ == "__main__":
    env_id, processes, num_envs, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    kwargs = {}
    for item in sys.argv[5:]:
        key, value = item.split("=", 1)
        kwargs[key] = int(value) if value.isdigit() else value
    with mp.get_context("spawn").Pool(processes) as pool:
        rates = pool.map(work, [(env_id, num_envs, seconds, kwargs, 1000 * i) for i in range(processes)])
    print(json.dumps({"processes": processes, "num_envs": num_envs, "env_steps_per_s": sum(rates),
                      "per_process": sum(rates) / processes}))
