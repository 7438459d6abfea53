"""A rollout's rewards: completions decoded up to their stop token, each scored against its prompt's answer."""
import numpy as np
import torch

from rlfarm.data import Rollout
from rlfarm.envs.text_tasks import DigitTokenizer
from rlfarm.rewards.rollouts import score_rollout
from rlfarm.rewards.verifiers import partial_credit


def test_score_rollout_decodes_up_to_eos_and_repeats_answers_per_group():
    tokenizer = DigitTokenizer()
    responses = [tokenizer.encode(text, add_bos=False) for text in ["1234$", "12345", "12$__", "9$___"]]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    rollout = Rollout(prompt_ids=torch.ones(4, 1, dtype=torch.long), prompt_mask=torch.ones(4, 1, dtype=torch.long),
                      response_ids=torch.tensor(responses), response_mask=mask, logprobs=torch.zeros(4, 5),
                      group_size=2, temperature=1.0, weight_version=0)
    rewards = score_rollout(rollout, ["1234", "92"], tokenizer, partial_credit, tokenizer.eos_id)
    # "1234" vs 1234: 1; "12345" vs 1234: 4/5; "12" vs 92: 1/2; "9" vs 92: 1/2
    np.testing.assert_allclose(rewards, [1.0, 0.8, 0.5, 0.5])
