"""`rlfarm train algo=grpo env=prompts model=hf_lm`: GRPO on a prompt file with a model loaded by path and its own
tokenizer (a tiny random Qwen2 + byte-level BPE tokenizer saved offline). It cannot learn arithmetic at this size:
these tests check that the path runs end to end, that rewards come from decoded completions, and that bad input
fails in one line before anything is written."""
import json

import pytest
import torch

from helpers import metrics_rows, one_line_error, read_summary, train

LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    from rlfarm.models.lm_factory import save_random_lm

    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny-lm"))


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    """20 GSM8K-style records: a question and a worked answer ending in '#### <number>'."""
    path = tmp_path_factory.mktemp("data") / "arith_train.jsonl"
    path.write_text("".join(json.dumps({"question": f"Tom has {a} apples and buys {b} more. How many apples?",
                                        "answer": f"{a} + {b} = {a + b} apples.\n#### {a + b}"}) + "\n"
                            for a, b in zip(range(3, 23), range(40, 0, -2))))
    return str(path)



def test_scorer_decodes_with_the_model_tokenizer_and_the_verifier_reads_the_last_number(lm_folder, prompt_file):
    """Completions end in EOS then padding; specials are skipped, so '... #### 43<|im_end|>' scores 1."""
    from rlfarm.algos.grpo_lm import GRPOConfig
    from rlfarm.data import Rollout
    from rlfarm.envs.hf_tokenizer import HFTokenizer
    from rlfarm.envs.text_tasks import TextTaskSpec
    from rlfarm.roles.llm import TextLabeler

    tokenizer = HFTokenizer.from_pretrained(lm_folder)
    texts = ["3 + 40 = 43 apples. #### 43", "The answer is 43", "<|im_start|>43<|im_end|>", "44", ""]
    completions = [tokenizer.encode(text) + [tokenizer.eos_id] for text in texts]
    width = max(map(len, completions)) + 2
    response = torch.tensor([ids + [tokenizer.pad_id] * (width - len(ids)) for ids in completions])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in completions])
    rollout = Rollout(prompt_ids=torch.zeros(5, 1, dtype=torch.long), prompt_mask=torch.ones(5, 1, dtype=torch.long),
                      response_ids=response, response_mask=mask, logprobs=torch.zeros(response.shape), group_size=5,
                      temperature=1.0, weight_version=0)
    cfg = GRPOConfig(model=lm_folder, verifier="last_number")
    scorer = TextLabeler(cfg, TextTaskSpec("prompts", path=prompt_file, tokenizer=lm_folder))
    assert scorer.score((rollout, ["3 + 40 = 43 apples.\n#### 43"])).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]


@pytest.mark.slow
def test_grpo_on_a_prompt_file_with_a_loaded_model_runs_through_the_roles(tmp_path, lm_folder, prompt_file):
    run_dir = tmp_path / "run"
    out = train(run_dir, "algo=grpo", "topology=local_llm", "reward=verifier", "env=prompts", f"env.path={prompt_file}",
                "env.chat_template=true", "env.max_new_tokens=8", "model=hf_lm", f"model.source={lm_folder}",
                LORA, "algo.max_updates=2", "algo.prompts_per_step=4", "algo.group_size=4",
                "algo.filter_groups=false")  # keep all-zero groups: the update runs even on 0 rewards
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["updates"] == 2 and summary["samples"] == 2 * 4 * 4 and 0.0 <= summary["reward_mean"] <= 1.0
    rows = metrics_rows(run_dir)
    assert len(rows) == 2 and all(0.0 <= row["reward"] <= 1.0 for row in rows)
    assert all(0 < row["response_len"] <= 8 and "loss" in row and row["staleness"] == 0 for row in rows)
    config = (run_dir / "config.yaml").read_text()
    assert "verifier: last_number" in config and "source: " + lm_folder in config
    saved = torch.load(run_dir / "checkpoints" / "final.pt", map_location="cpu", weights_only=False)["model"]
    assert any("lora_" in name for name in saved)


@pytest.mark.parametrize("args, needle", [
    pytest.param(["model.source={model}", "env.path={tmp}/nope.jsonl"],
                 "env.path: no such file '{tmp}/nope.jsonl' — set env.path=", id="file-missing"),
    pytest.param(["model.source={model}", "env.path={tmp}/bad.jsonl"],
                 "record 0 has no field 'answer' (fields: question, solution) — set env.answer_field=",
                 id="field-absent"),
    pytest.param(["model=tiny_lm", "env.path={data}"],
                 "prompt files need a tokenizer, but model.config builds a model without one — use model=hf_lm "
                 "model.source=<path>", id="model-without-tokenizer"),
    pytest.param(["model.source={tmp}/no-model", "env.path={data}"], "model.source: no such folder '{tmp}/no-model'",
                 id="model-folder-missing"),
    pytest.param(["env.path={data}"], "model.source is required but not set", id="model-source-unset"),
    pytest.param(["model.source={tmp}/no-template", "env.path={data}", "env.chat_template=true"],
                 "env.chat_template=true, but the tokenizer in '{tmp}/no-template' has no chat template — set "
                 "env.chat_template=false", id="chat-template-missing"),
])
def test_bad_prompt_input_is_one_line_and_leaves_no_run_dir(tmp_path, lm_folder, prompt_file, args, needle):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "solution": "#### 1"}) + "\n")
    (tmp_path / "no-template").mkdir()  # a saved tokenizer whose config has no chat template
    (tmp_path / "no-template" / "tokenizer_config.json").write_text(json.dumps({"chat_template": None}))
    (tmp_path / "no-template" / "config.json").write_text("{}")  # a model folder: the path check lets it through
    for key, value in {"{tmp}": str(tmp_path), "{data}": prompt_file, "{model}": lm_folder}.items():
        args, needle = [a.replace(key, value) for a in args], needle.replace(key, value)
    out = train(tmp_path / "run", "algo=grpo", "topology=local_llm", "reward=verifier", "env=prompts", "model=hf_lm",
                *args, timeout=120)
    line = one_line_error(out)
    assert line.startswith("error: ") and needle in line, line
    assert not (tmp_path / "run").exists()


def test_the_grpo_prompts_experiment_bundles_env_model_verifier_and_topology(lm_folder, prompt_file):
    from rlfarm.config import compose

    cfg = compose("train", ["experiment=grpo_prompts", f"env.path={prompt_file}", f"model.source={lm_folder}"])
    assert (cfg.env.id, cfg.model.source, cfg.topology.name, cfg.algo.name) == ("prompts", lm_folder, "local_llm", "grpo")
    assert cfg.reward.verifier == "last_number" and cfg.env.chat_template is True
