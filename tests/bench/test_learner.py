"""The fast SAC update path (rlfarm/algos/sac_graph.py) against the eager SACAgent.update, and `rlfarm bench learner`.

Equality is checked on fixed batches with the actor's noise fed in: the fast path takes the noise as an
input, and the test draws it from the same seed in the same order as the eager update draws it inside.
"""
import functools
import json

import pytest
import torch

from rlfarm.algos.sac import SACAgent
from rlfarm.algos.sac_graph import (GraphedSACUpdates, ReplayUpdates, SACStep, fixed_draw, replay_draw,
                                    squashed_sample)
from rlfarm.bench.learner import kernel_kind
from rlfarm.models.mlp import EnsembleQ, SquashedGaussianActor
from helpers import rlfarm

OBS, ACT, BATCH = 17, 6, 64


def make_agent(device="cpu", seed=0, **kw):
    torch.manual_seed(seed)
    return SACAgent(OBS, ACT, [-1.0] * ACT, [2.0] * ACT, actor=functools.partial(SquashedGaussianActor, hidden=(32, 32)),
                    critic=functools.partial(EnsembleQ, hidden=(32, 32)), device=device, **kw)


def fixed_batches(updates, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    batches = {"obs": torch.randn(updates, BATCH, OBS, generator=g),
               "action": torch.rand(updates, BATCH, ACT, generator=g) * 3 - 1,
               "reward": torch.randn(updates, BATCH, generator=g),
               "next_obs": torch.randn(updates, BATCH, OBS, generator=g),
               "terminated": (torch.rand(updates, BATCH, generator=g) < 0.2).float()}
    return {k: v.to(device) for k, v in batches.items()}


def eager_noise(agent, updates, seed, device):
    """The draws `updates` eager updates make after torch.manual_seed(seed), in the fast path's layout
    [K, 1 + policy_frequency, B, act]: a' for the critic target, then one draw per actor step."""
    torch.manual_seed(seed)
    noise = torch.zeros(updates, 1 + agent.policy_frequency, BATCH, ACT, device=device)
    for k in range(updates):
        draws = 1 + agent.policy_frequency if (agent.updates + k) % agent.policy_frequency == 0 else 1
        for j in range(draws):
            noise[k, j] = torch.randn(BATCH, ACT, device=device)
    return noise


def eager_updates(agent, batches, seed):
    torch.manual_seed(seed)
    metrics = {}
    for k in range(next(iter(batches.values())).shape[0]):
        metrics.update(agent.update({name: values[k] for name, values in batches.items()}))
    return metrics


def state(agent):
    return [*agent.actor.parameters(), *agent.critic.parameters(), *agent.critic_target.parameters(), agent.log_alpha]


def assert_same(eager, fast, eager_metrics, fast_metrics, tol=1e-5):
    assert set(eager_metrics) == set(fast_metrics) == {"critic_loss", "actor_loss", "entropy", "alpha"}
    for name in eager_metrics:
        assert torch.allclose(eager_metrics[name], fast_metrics[name], rtol=tol, atol=tol), name
    for a, b in zip(state(eager), state(fast), strict=True):
        assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max()
    assert eager.updates == fast.updates
    moved = [(a - b).abs().max().item() for a, b in zip(state(fast), state(make_agent(str(fast.device))))]
    assert max(moved) > 1e-4  # the updates did move the weights: equality is not two untouched agents


def test_squashed_sample_with_given_noise_is_the_actors_sample():
    actor = make_agent().actor
    obs = torch.randn(BATCH, OBS)
    torch.manual_seed(3)
    action, logp = actor.sample(obs)
    torch.manual_seed(3)
    given_action, given_logp = squashed_sample(actor, obs, torch.randn(BATCH, ACT))
    assert torch.equal(action, given_action) and torch.equal(logp, given_logp)


@pytest.mark.parametrize("updates_per_call", [2, 4])
def test_fast_path_equals_eager_updates_on_fixed_batches(updates_per_call):
    eager, fast = make_agent(), make_agent()
    batches = fixed_batches(updates_per_call, "cpu")
    noise = eager_noise(fast, updates_per_call, seed=11, device="cpu")
    fast_metrics = GraphedSACUpdates(SACStep(fast), fixed_draw(batches, noise), updates_per_call)()
    assert_same(eager, fast, eager_updates(eager, batches, seed=11), fast_metrics)


def test_fast_path_without_autotune_keeps_alpha():
    eager, fast = make_agent(autotune=False, init_alpha=0.3), make_agent(autotune=False, init_alpha=0.3)
    batches = fixed_batches(2, "cpu")
    fast_metrics = GraphedSACUpdates(SACStep(fast), fixed_draw(batches, eager_noise(fast, 2, 5, "cpu")), 2)()
    assert_same(eager, fast, eager_updates(eager, batches, seed=5), fast_metrics)
    assert fast.alpha.item() == pytest.approx(0.3)


def test_schedule_must_line_up_with_policy_frequency():
    agent = make_agent()
    draw = fixed_draw(fixed_batches(2, "cpu"), torch.zeros(2, 3, BATCH, ACT))
    with pytest.raises(ValueError, match="multiple of policy_frequency"):
        GraphedSACUpdates(SACStep(agent), draw, updates_per_call=3)
    agent.update({name: values[0] for name, values in fixed_batches(1, "cpu").items()})
    with pytest.raises(RuntimeError, match="not at a multiple of policy_frequency"):
        GraphedSACUpdates(SACStep(agent), draw, updates_per_call=2)()


def test_replay_draw_samples_only_filled_rows():
    from rlfarm.buffers.replay import ReplayBuffer
    from rlfarm.buffers.sampler import UniformSampler
    from rlfarm.buffers.storage import TensorStorage

    agent = make_agent()
    capacity, filled = 1000, 10
    buffer = ReplayBuffer(TensorStorage(capacity), UniformSampler(BATCH))
    buffer.extend({"obs": torch.full((capacity, OBS), -1.0), "reward": torch.full((capacity,), -1.0)})
    buffer.storage.fields["obs"][:filled] = torch.arange(filled, dtype=torch.float32)[:, None]
    buffer.storage.fields["reward"][:filled] = torch.arange(filled, dtype=torch.float32)
    draw = replay_draw(buffer, torch.tensor(float(filled), dtype=torch.float64), 4, agent)
    batches, noise = draw()
    assert batches["obs"].shape == (4, BATCH, OBS) and batches["reward"].shape == (4, BATCH)
    assert noise.shape == (4, 1 + agent.policy_frequency, BATCH, ACT)
    assert batches["reward"].min() >= 0 and len(batches["reward"].unique()) == filled  # all rows, none unfilled
    assert torch.equal(batches["obs"][..., 0], batches["reward"])  # rows gathered whole


def test_bench_learner_on_cpu_writes_rows_with_ratios(tmp_path):
    # Sizes from overrides, as the lead compares the bench with a run at the run's batch and hidden sizes.
    out = rlfarm("bench", "learner", "device=cpu", "bench.sizes_cpu.batch_size=48", "bench.sizes_cpu.hidden=[24,24]",
                 f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert result["bench"] == "learner" and result["device_name"].startswith("cpu")
    assert result["command"].startswith("rlfarm bench learner device=cpu")
    assert set(result["versions"]) >= {"python", "torch", "transformers", "ray"}
    rows = {row["case"]: row for row in result["rows"]}
    for case in ("pendulum", "halfcheetah"):
        eager = rows[f"{case}/eager"]
        fast = [row for row in result["rows"] if row["baseline"] == f"{case}/eager"]
        assert eager["value"] > 0 and fast and all("error" not in row for row in fast)
        for row in fast:
            assert row["ratio"] == pytest.approx(row["value"] / eager["value"])
        # the learner role's own bursts at the same sizes (on CPU: eager, bursts of 8, no graph)
        role = rows[f"{case}/role"]
        assert role["value"] > 0 and role["graph"] is False and role["updates_per_call"] == 8
    # HalfCheetah's role loop beside its pipeline neighbours: each row had them (chunks stored at the set rate, a
    # renderer process drawing frames) and is held against the loop alone
    loop = rows["halfcheetah/role loop"]
    assert loop["value"] > 0 and loop["baseline"] is None and loop["stored_per_s"] == 0
    for neighbours in ("ingest", "renderers", "renderers + ingest"):
        row = rows[f"halfcheetah/role loop + {neighbours}"]
        assert row["value"] > 0 and row["ratio"] == pytest.approx(row["value"] / loop["value"])
        assert (row["stored_per_s"] > 500) == ("ingest" in neighbours)  # 1,000/s asked for
        assert (row.get("frames_per_s", 0) > 0) == ("renderers" in neighbours)
    assert "pendulum/role loop" not in rows
    assert {(row["batch"], row["hidden"]) for row in result["rows"]} == {(48, "24×24")}
    assert "ratio" in out.stdout  # the table


def random_buffer(rows, device, batch=BATCH):
    from rlfarm.buffers.replay import ReplayBuffer
    from rlfarm.buffers.sampler import UniformSampler
    from rlfarm.buffers.storage import TensorStorage

    buffer = ReplayBuffer(TensorStorage(rows, device), UniformSampler(batch, generator_seed=0))
    g = torch.Generator().manual_seed(1)
    buffer.extend({"obs": torch.randn(rows, OBS, generator=g), "action": torch.rand(rows, ACT, generator=g) * 3 - 1,
                    "reward": torch.randn(rows, generator=g), "next_obs": torch.randn(rows, OBS, generator=g),
                    "terminated": torch.zeros(rows)})
    return buffer


def check_replay_updates(device, batch=BATCH):
    agent = make_agent(device)
    updates = ReplayUpdates(agent, random_buffer(300, device, batch), graph_updates=4)
    # detach(): a clone that records autograd history would keep the parameters' gradient accumulators
    # (made on the default stream) alive, and backward inside a later capture would wait on that stream.
    before = [p.detach().clone() for p in state(agent)]
    updates(3)  # fewer than graph_updates: one by one
    assert agent.updates == 3 and updates._graphed is None
    # One eager update to get back in step with policy_frequency, then two calls of 4.
    metrics = updates(9)
    assert agent.updates == 12 and updates._graphed is not None
    assert set(metrics) == {"critic_loss", "actor_loss", "entropy", "alpha"}
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, state(agent)))
    # A restored checkpoint has new optimizer state tensors: the fast path is rebuilt, and keeps updating.
    agent.load_state_dict(agent.state_dict())
    updates.reset()
    assert updates._graphed is None
    updates(4)
    assert agent.updates == 16


def test_replay_updates_mix_graph_calls_and_eager_updates():
    check_replay_updates("cpu")


def test_kernel_names_sort_into_kinds():
    assert kernel_kind("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32") == "gemm"
    assert kernel_kind("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>") == "gemm"
    assert kernel_kind("triton_poi_fused_add_mul_relu_0") == "triton"
    assert kernel_kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optim"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") == "other"


@pytest.mark.gpu
@pytest.mark.parametrize("compile, compile_optimizers", [(False, False), (True, False), (True, True)],
                         ids=["graph", "graph+compiled losses", "graph+compile"])
def test_graph_equals_eager_updates_on_cuda(compile, compile_optimizers):
    eager, fast = make_agent("cuda"), make_agent("cuda")
    updates_per_call = 4
    static_batches = fixed_batches(updates_per_call, "cuda")
    static_noise = eager_noise(fast, updates_per_call, seed=11, device="cuda")
    graphed = GraphedSACUpdates(SACStep(fast, compile=compile, compile_optimizers=compile_optimizers),
                                fixed_draw(static_batches, static_noise), updates_per_call)
    assert graphed.graph
    fast_metrics = {k: v.clone() for k, v in graphed().items()}
    assert_same(eager, fast, eager_updates(eager, static_batches, seed=11), fast_metrics)
    # A second replay reads refilled inputs and continues from where the first left the agent.
    batches = fixed_batches(updates_per_call, "cuda", seed=1)
    for name, values in batches.items():
        static_batches[name].copy_(values)
    static_noise.copy_(eager_noise(fast, updates_per_call, seed=12, device="cuda"))
    fast_metrics = graphed()
    assert_same(eager, fast, eager_updates(eager, batches, seed=12), fast_metrics)


@pytest.mark.gpu
def test_replay_updates_with_graphs_on_cuda():
    check_replay_updates("cuda")


@pytest.mark.gpu
def test_replay_updates_with_graphs_at_a_large_batch_on_cuda():
    """Many-env settings draw batches of thousands (from a buffer smaller than one batch, here): the graphs
    capture and replay at that size too."""
    check_replay_updates("cuda", batch=4096)
