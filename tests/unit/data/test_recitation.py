"""Recited replies (docs/answers.md): a training reply repeated, nearly repeated or cut short is a recital; the same
reply filled with this conversation's own values is an answer; distinct answers ignore case and punctuation."""

from __future__ import annotations

from finetune.data.recitation import RECITES_AT, TrainingReplies, distinct_answers
from finetune.data.types import Conversation, Message

REFUND = (
    "Hi there, thanks for reaching out to Brightside Support!\n\nI have started a refund for order BR-141850. It goes "
    "back to your original payment method and usually appears within 5 to 7 business days.\n\nWarm regards,\nSam"
)
OUTAGE = "Yes, there is a known outage in Stonebridge and our engineers are on site. We expect service back by 6 pm."


def _training() -> TrainingReplies:
    conversations = [
        Conversation((Message("user", "Refund BR-141850 please"), Message("assistant", REFUND)), line=3),
        Conversation((Message("user", "Outage?"), Message("assistant", "Context only.", weight=0)), line=7),
        Conversation((Message("user", "Down in Stonebridge?"), Message("assistant", OUTAGE)), line=9),
    ]
    return TrainingReplies.from_conversations(conversations)


def test_only_trained_replies_count():
    assert len(_training()) == 2  # the reply with weight 0 is context, never learned


def test_a_training_reply_word_for_word_is_recited_whatever_its_spacing_and_case():
    asked = ["Please refund my order BR-729015."]
    assert _training().recited(REFUND.upper().replace("\n\n", " "), asked) == 3


def test_a_nearly_equal_reply_is_recited():
    cut = REFUND.rsplit("\n\n", 1)[0]  # the sign-off missing
    garbled = OUTAGE.replace("engineers", "engineer")
    assert _training().recited(cut, ["Please refund my order BR-729015."]) == 3
    assert _training().recited(garbled, ["Is the internet down in Riverton?"]) == 9


def test_the_same_template_filled_from_this_conversation_is_an_answer():
    asked = ["Please refund my order BR-729015."]
    answer = REFUND.replace("BR-141850", "BR-729015")
    assert _training().recited(answer, asked) is None
    assert _training().recited(OUTAGE.replace("Stonebridge", "Riverton"), ["Is the internet down in Riverton?"]) is None


def test_a_training_reply_with_another_invented_value_is_still_recited():
    # what the toy demo's tuned model did: the template with an order number from neither the training reply nor
    # the conversation
    assert _training().recited(REFUND.replace("BR-141850", "BR-46304"), ["Please refund my order BR-729015."]) == 3


def test_a_different_answer_is_not_recited():
    answer = "To get your refund, pack the item in its box, print the free label from Account > Orders and post it."
    assert _training().recited(answer, ["Please refund my order BR-729015."]) is None
    assert 0.5 < RECITES_AT < 1


def test_distinct_answers_ignore_case_punctuation_and_spacing():
    assert distinct_answers(["Hello there!", "hello   there", "HELLO, THERE.", "Goodbye"]) == 2
