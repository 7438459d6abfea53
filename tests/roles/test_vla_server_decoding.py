"""The inference server's static-cache decoding (`GraphedDecoding`, here with capture off: CUDA graphs need a GPU)
samples tokens whose log-probs the learner's teacher-forced recompute matches, padded batches included; the
server picks float32 on CPU and says why graphs are off."""
import torch


def test_static_cache_decoding_matches_the_learners_recompute(tmp_path, one_torch_thread):
    from rlfarm.models.lm_factory import save_random_llava
    from rlfarm.models.vla import load_hf_vla_actions
    from rlfarm.roles.vla_server import GraphedDecoding, inference_dtype

    policy = load_hf_vla_actions(str(save_random_llava(tmp_path / "llava")), num_tokens=6, max_words=8).eval()
    with torch.no_grad():  # away from the uniform start, so a wrong mask or position would show
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    assert inference_dtype(policy, "cpu") == torch.float32 and inference_dtype(policy, "cuda:0") == torch.bfloat16
    assert GraphedDecoding.build(policy, "cpu", 8) == (None, "off (CPU)")
    decoding = GraphedDecoding(policy, (4, 8), capture=False)
    gen = torch.Generator().manual_seed(0)
    image = torch.randint(0, 255, (3, 3, 16, 16), dtype=torch.uint8, generator=gen)
    words = torch.as_tensor(policy.tokenizer.encode(["push the cube left", "move the block right now please", "x"]))
    for rows in (3, 1, 3):  # padded to 4 rows; the cache is rewound between batches
        tokens, logprobs = decoding.sample(image[:rows], words[:rows], 1.6, gen)
        assert tokens.shape == (rows, 6) and logprobs.mean() > -5.5  # not uniform: the policy is read
        recomputed = policy.token_logprobs(image[:rows], words[:rows], None, tokens, 1.6)
        assert (recomputed - logprobs).abs().max() < 1e-4
