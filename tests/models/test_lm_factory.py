"""lm_factory's VLA shapes: the VLA-sized ones have the towers they name (counted on the meta device: nothing is
allocated), and the saved-checkpoint path of those shapes loads as `model=hf_vla` does (checked on a shrunk shape)."""
import pytest
import torch


@pytest.mark.parametrize("shape, low, high, patches", [("vitb16-qwen0.5b", 0.40e9, 0.50e9, 196),
                                                        ("vitl14-qwen0.5b", 0.60e9, 0.72e9, 256)])
def test_vla_sized_shapes_are_a_clip_vit_before_a_qwen25_05b_text_model(shape, low, high, patches):
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    from rlfarm.models.lm_factory import VLA_SHAPES

    vision, text = VLA_SHAPES[shape]
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"],
            text["num_key_value_heads"], text["intermediate_size"]) == (896, 24, 14, 2, 4864)
    assert (vision["image_size"] // vision["patch_size"]) ** 2 == patches
    config = LlavaConfig(vision_config=CLIPVisionConfig(**vision), text_config=Qwen2Config(**text, vocab_size=640),
                         image_token_id=300)
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    assert low < sum(p.numel() for p in model.parameters()) < high


def test_a_vla_shape_saves_in_bf16_and_loads_as_an_action_policy(tmp_path, monkeypatch, one_torch_thread):
    from rlfarm.models import lm_factory
    from rlfarm.models.vla import load_hf_vla_actions

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256}
    monkeypatch.setitem(lm_factory.VLA_SHAPES, "small", (vision, text))
    path = lm_factory.save_random_llava(tmp_path / "vla", shape="small")
    assert 0 < lm_factory.count_parameters(path) < 1e6
    from safetensors import safe_open

    with safe_open(str(next(path.glob("*.safetensors"))), "pt") as saved:
        assert {saved.get_tensor(name).dtype for name in saved.keys()} == {torch.bfloat16}
    policy = load_hf_vla_actions(str(path), num_tokens=4, max_words=8).eval()
    assert policy.image_tokens == 16 and policy.policy.first_action_id >= len(policy.tokenizer.tokenizer)
    image = torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.uint8)
    words = torch.as_tensor(policy.tokenizer.encode(["push the cube left", "move the block"]))
    tokens, logprobs = policy.sample(image, words, None, 1.0, torch.Generator().manual_seed(0))
    assert tokens.shape == (2, 4) and int(tokens.max()) < 256
    recomputed = policy.token_logprobs(image, words, None, tokens, 1.0)
    assert (recomputed - logprobs).abs().max() < 1e-4
