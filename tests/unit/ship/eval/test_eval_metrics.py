"""Answer metrics: exact match, token F1, ROUGE-L, rules and the win rate, on hand-checked examples."""

from __future__ import annotations

import pytest

from finetune.settings.errors import UserError
from finetune.ship.eval.metrics import exact_match, parse_rules, rouge_l, rule_win_rate, score, summarize, token_f1


def test_exact_match_ignores_case_and_spacing_only():
    assert exact_match("  Hello   World\n", "hello world") == 1.0
    assert exact_match("Hello, world", "hello world") == 0.0


def test_rouge_l_is_the_lcs_f_measure():
    # LCS of "the cat sat on the mat" and "the cat on the mat" is 5 words: P = 5/5, R = 5/6
    assert rouge_l("the cat on the mat", "the cat sat on the mat") == pytest.approx(2 * 1 * (5 / 6) / (1 + 5 / 6))
    assert rouge_l("dog", "the cat") == 0.0
    assert token_f1("the cat on the mat", "the cat sat on the mat") == pytest.approx(2 * 1 * (5 / 6) / (1 + 5 / 6))


def test_rules_and_win_rate():
    rules = parse_rules(["greeting=^Hi there", "signoff=Warm regards"])
    both = score("Hi there!\nDone.\nWarm regards", "x", rules)
    one = score("Hello!\nWarm regards", "x", rules)
    none = score("ok", "x", rules)
    assert (both["rule:greeting"], both["rule:signoff"]) == (1.0, 1.0)
    assert (one["rule:greeting"], one["rule:signoff"]) == (0.0, 1.0)
    assert both["answer_length"] == 5.0  # words: Hi, there!, Done., Warm, regards
    assert summarize([both, one, none])["rule:signoff"] == pytest.approx(2 / 3)
    result = rule_win_rate([none, one, both], [both, one, none], list(rules))
    assert result == {"wins": 1, "ties": 1, "losses": 1, "win_rate": pytest.approx(1 / 3)}


@pytest.mark.parametrize("bad", ["greeting", "=x", "broken=(unclosed"])
def test_bad_rules_are_user_errors(bad):
    with pytest.raises(UserError, match="--rule"):
        parse_rules([bad])
