"""Recited replies: an answer that is a training reply, equal or nearly so, instead of an answer to its question.

    replies = TrainingReplies.from_conversations(training_conversations)
    replies.recited(answer, context)        # the file line of the training reply the answer recites, or None
    distinct_answers(answers)               # how many different answers there are

The rule (docs/answers.md). Answer and training reply are compared word by word: lower case, punctuation and
spacing ignored (`words`). The answer recites the reply when

1. they are nearly equal: difflib's ratio of the two word sequences (2 x words in matching blocks / words of both)
   is at least RECITES_AT (0.9: a reply of 50 words repeated with up to about five words changed, added or cut), and
2. the answer took nothing from its own conversation in their place: none of the words it has where the reply
   differs appears in the conversation it answers unless the reply has it too.

So a training reply repeated word for word, cut short, or with a word garbled is recited; the same reply filled with
this customer's order number, amount or town (words of the conversation) is an answer, not a recital.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher

from finetune.data.types import Conversation

RECITES_AT = 0.9
_WORD = re.compile(r"\w+")


def words(text: str) -> tuple[str, ...]:
    """The text's words in lower case: what recitation and distinctness compare."""
    return tuple(_WORD.findall(text.lower()))


def distinct_answers(answers: Iterable[str]) -> int:
    """How many different answers, compared as `words` (case, punctuation and spacing ignored)."""
    return len({words(answer) for answer in answers})


@dataclass(frozen=True)
class Reply:
    line: int
    words: tuple[str, ...]


class TrainingReplies:
    """The replies a model was trained on (every assistant message with a weight above 0), for `recited`."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self._exact = {}
        for reply in replies:
            self._exact.setdefault(reply.words, reply.line)

    @classmethod
    def from_conversations(cls, conversations: Iterable[Conversation]) -> TrainingReplies:
        return cls(
            [
                Reply(c.line, words(m.content))
                for c in conversations
                for m in c.messages
                if m.role == "assistant" and m.weight > 0 and m.content.strip()
            ]
        )

    def __len__(self) -> int:
        return len(self.replies)

    def recited(self, answer: str, context: Iterable[str]) -> int | None:
        """The line of the training reply `answer` recites (module docstring: the rule), or None."""
        said = words(answer)
        if not said:
            return None
        if said in self._exact:
            return self._exact[said]
        given = {w for text in context for w in words(text)}
        matcher = SequenceMatcher(autojunk=False)
        matcher.set_seq2(said)  # the answer is the sequence SequenceMatcher keeps its index of
        for reply in self.replies:
            matcher.set_seq1(reply.words)
            if matcher.real_quick_ratio() < RECITES_AT or matcher.quick_ratio() < RECITES_AT:
                continue
            if matcher.ratio() >= RECITES_AT and not _taken_from_conversation(matcher, said, reply.words, given):
                return reply.line
        return None


def _taken_from_conversation(matcher: SequenceMatcher, said: tuple[str, ...], reply: tuple[str, ...], given) -> bool:
    """Whether the answer has, where it differs from the reply, a word of its conversation the reply does not have."""
    own = set(reply)
    for tag, _, _, start, end in matcher.get_opcodes():
        if tag in ("replace", "insert") and any(w in given and w not in own for w in said[start:end]):
            return True
    return False
