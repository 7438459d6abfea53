"""Packed grouped-query decoding (rlfarm/models/gqa_decoding.py): the same attention as expanding the KV cache, and a
Llava-style VLA switched to it samples the same action tokens with log-probabilities the learner recomputes."""
import torch
import torch.nn.functional as F

from rlfarm.models.gqa_decoding import packed_gqa_attention, use_packed_gqa_decoding


class _Grouped(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def test_packed_heads_equal_attention_over_the_expanded_cache():
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(4, 6, 1, 8, generator=gen)                   # 6 query heads ...
    key, value = torch.randn(2, 4, 2, 11, 8, generator=gen)          # ... over 2 KV heads, 11 cached positions
    mask = torch.rand(4, 1, 1, 11, generator=gen) > 0.3
    mask[..., 0] = True
    out, _ = packed_gqa_attention(_Grouped(), query, key, value, mask, scaling=0.3)
    expanded = F.scaled_dot_product_attention(query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1),
                                              attn_mask=mask, scale=0.3)
    assert out.shape == (4, 1, 6, 8)
    torch.testing.assert_close(out, expanded.transpose(1, 2), atol=1e-6, rtol=0)


def test_a_grouped_query_vla_decodes_the_same_with_packed_heads():
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    from rlfarm.models.vla import HFVLAPolicy

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    text = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=128)
    torch.manual_seed(0)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=2, vision_feature_layer=-1,
                         vision_feature_select_strategy="default")
    policy = HFVLAPolicy(LlavaForConditionalGeneration(config).eval(), num_tokens=6)
    ids = torch.cat([torch.full((3, 16), 2), torch.randint(3, 40, (3, 5), generator=torch.Generator().manual_seed(1))], 1)
    pixels, mask = torch.randn(3, 3, 32, 32), torch.ones_like(ids)
    mask[0, 16:18] = 0  # a left-padded instruction
    with torch.no_grad():
        before = policy.sample(pixels, ids, 1.3, torch.Generator().manual_seed(2), prompt_mask=mask)
        assert use_packed_gqa_decoding(policy.model) == "packed GQA decoding"
        assert policy.model.config.text_config._attn_implementation != policy.model.config.vision_config._attn_implementation
        tokens, logprobs = policy.sample(pixels, ids, 1.3, torch.Generator().manual_seed(2), prompt_mask=mask)
        recomputed = policy.token_logprobs(pixels, ids, tokens, 1.3, prompt_mask=mask)  # teacher-forced: HF's SDPA
    assert torch.equal(tokens, before[0])
    torch.testing.assert_close(logprobs, before[1], atol=1e-5, rtol=0)
    assert (recomputed - logprobs).abs().max() < 1e-4
