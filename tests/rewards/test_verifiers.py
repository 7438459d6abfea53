import numpy as np
import pytest

from rlfarm.rewards.verifiers import exact_match, get_verifier, last_number, partial_credit


def test_exact_match_ignores_surrounding_whitespace():
    rewards = exact_match([" 42\n", "42", "4 2"], ["42", "43", "42"])
    assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 0.0, 0.0]


def test_last_number_compares_the_final_numbers_numerically():
    completions = ["so 3 + 4 = 7", "I get 1,234.0 apples", "x = -5", "no idea", "7 then 8"]
    answers = ["... #### 7", "1234", "-5", "1", "#### 7"]
    assert last_number(completions, answers).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert last_number(["12"], ["no number here"]).tolist() == [0.0]


def test_partial_credit_is_the_fraction_of_equal_positions_over_the_longer_string():
    completions = ["1234", "1294", "12345", "12", "", "", "4321"]
    answers = ["1234", "1234", "1234", "1234", "", "12", "1234"]
    # 4/4, 3/4, 4/5 (ran on past the answer), 2/4, empty = empty, 0/2, 0/4
    rewards = partial_credit(completions, answers)
    assert rewards.dtype == np.float32
    np.testing.assert_allclose(rewards, [1.0, 0.75, 0.8, 0.5, 1.0, 0.0, 0.0])


def test_verifiers_by_name_and_length_check():
    assert get_verifier("partial_credit") is partial_credit
    with pytest.raises(KeyError, match="known: exact_match, last_number, partial_credit"):
        get_verifier("bleu")
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        exact_match(["a", "b"], ["a"])
