"""Write the instruction-following part of `finetune eval RUN --retention`: longer answers with rules on their form.

    python examples/generate_instructions.py            # writes finetune/ship/eval/general/instructions.jsonl
    python examples/generate_instructions.py OUT_DIR    # writes OUT_DIR/instructions.jsonl

Seeded and standard-library only: running it again gives a byte-identical file. Each line is one request for an
answer of 100-200 words (a short article, a letter, a story, an explanation, ...) carrying one or two instructions
on the answer's form, each checked by finetune/ship/eval/instructions.py with no judge:
    {"id", "task", "prompt", "instructions": [{"kind", "args"?}, ...]}
The instruction kinds are the ones a team's own format competes with (a title, a postscript, placeholders, a number
of bullet points, JSON, words to avoid or to use, a letter's frequency, a length, lowercase or capitals, no commas,
an ending sentence, quotation marks, paragraphs, sections, highlighted parts). The tasks and their wording are this
file's own: none comes from the replay prompts' generator (make_replay_prompts.py), and
tests/unit/data/test_replay_prompts.py holds the two sets apart.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 41
COUNT = 300  # requests: half with one instruction, half with two
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "finetune" / "ship" / "eval" / "general"

# (task kind, the request, two words an answer to it is likely to use, two it could weave in)
TASKS: list[tuple[str, str, tuple[str, str], tuple[str, str]]] = [
    (
        "article",
        "Write a short magazine article about why people keep bees in cities.",
        ("honey", "hive"),
        ("rooftop", "pollen"),
    ),
    ("article", "Write a short article about the history of the bicycle.", ("wheel", "ride"), ("pedal", "frame")),
    (
        "article",
        "Write a short newspaper piece about a town that built a new public library.",
        ("books", "library"),
        ("reader", "shelves"),
    ),
    (
        "article",
        "Write a short article on how lighthouses guided ships before satellites.",
        ("light", "ships"),
        ("coast", "lamp"),
    ),
    (
        "article",
        "Write a short article about the first time people climbed a very high mountain.",
        ("summit", "climb"),
        ("rope", "oxygen"),
    ),
    ("article", "Write a short article on how paper is made from trees.", ("paper", "wood"), ("pulp", "mill")),
    ("article", "Write a short article about the invention of the telephone.", ("phone", "call"), ("wire", "voice")),
    ("article", "Write a short article about why the ocean is salty.", ("salt", "water"), ("river", "minerals")),
    ("article", "Write a short article about how bread rises.", ("bread", "yeast"), ("dough", "oven")),
    ("article", "Write a short article on the life of honeybees in winter.", ("bees", "winter"), ("cluster", "queen")),
    (
        "letter",
        "Write a letter to a neighbour asking them to water your plants while you travel.",
        ("plants", "water"),
        ("key", "balcony"),
    ),
    (
        "letter",
        "Write a letter to a local council asking for a new crossing near a school.",
        ("school", "road"),
        ("traffic", "safety"),
    ),
    (
        "letter",
        "Write a letter to a grandparent describing your first week at a new job.",
        ("job", "week"),
        ("colleagues", "office"),
    ),
    (
        "letter",
        "Write a letter to a former teacher thanking them for their patience.",
        ("teacher", "thank"),
        ("lessons", "class"),
    ),
    (
        "letter",
        "Write a letter to a hotel asking whether they have a room with a garden view.",
        ("room", "hotel"),
        ("garden", "booking"),
    ),
    (
        "letter",
        "Write a letter to a friend inviting them to a picnic by the lake.",
        ("picnic", "lake"),
        ("basket", "sandwiches"),
    ),
    (
        "letter",
        "Write a letter to a museum suggesting an exhibition about old maps.",
        ("maps", "museum"),
        ("explorers", "ink"),
    ),
    ("letter", "Write a letter to a bakery praising the bread they sell.", ("bread", "bakery"), ("crust", "morning")),
    ("story", "Write a short story about a fox who learns to share its food.", ("fox", "food"), ("forest", "berries")),
    (
        "story",
        "Write a short story about a child who finds a message in a bottle.",
        ("bottle", "message"),
        ("beach", "waves"),
    ),
    ("story", "Write a short story about a robot that wants to paint.", ("robot", "paint"), ("canvas", "colours")),
    ("story", "Write a short story about a train that is always late.", ("train", "late"), ("station", "clock")),
    (
        "story",
        "Write a short story about an old clockmaker and his apprentice.",
        ("clock", "time"),
        ("gears", "workshop"),
    ),
    ("story", "Write a short story about two friends lost in a snowstorm.", ("snow", "cold"), ("cabin", "lantern")),
    ("story", "Write a short story about a cat that guards a bookshop.", ("cat", "books"), ("window", "customer")),
    (
        "story",
        "Write a short story about a sailor who sees a whale for the first time.",
        ("whale", "sea"),
        ("deck", "spray"),
    ),
    ("explain", "Explain to a beginner how a rainbow forms.", ("light", "rain"), ("colours", "prism")),
    ("explain", "Explain to a beginner why the Moon has phases.", ("moon", "sun"), ("orbit", "shadow")),
    ("explain", "Explain to a beginner how vaccines train the body.", ("body", "virus"), ("immune", "protection")),
    ("explain", "Explain to a beginner what compound interest is.", ("money", "interest"), ("savings", "years")),
    ("explain", "Explain to a beginner how a bill becomes a law.", ("law", "vote"), ("parliament", "debate")),
    (
        "explain",
        "Explain to a beginner why leaves change colour in autumn.",
        ("leaves", "autumn"),
        ("chlorophyll", "trees"),
    ),
    ("explain", "Explain to a beginner how an airplane stays in the air.", ("wings", "air"), ("lift", "engine")),
    (
        "explain",
        "Explain to a beginner what a healthy breakfast looks like.",
        ("breakfast", "food"),
        ("fruit", "protein"),
    ),
    ("explain", "Explain to a beginner how recycling glass works.", ("glass", "recycling"), ("furnace", "bottles")),
    ("explain", "Explain to a beginner why we have seasons.", ("sun", "earth"), ("tilt", "summer")),
    ("description", "Describe a busy market on a Saturday morning.", ("market", "people"), ("stalls", "vegetables")),
    ("description", "Describe a quiet mountain village in spring.", ("village", "mountain"), ("flowers", "stream")),
    ("description", "Describe a thunderstorm over a wheat field.", ("storm", "rain"), ("thunder", "wheat")),
    ("description", "Describe the inside of an old railway station.", ("station", "trains"), ("benches", "clock")),
    ("description", "Describe a kitchen on the morning of a big family meal.", ("kitchen", "food"), ("oven", "table")),
    ("description", "Describe a coral reef to someone who has never seen one.", ("reef", "fish"), ("coral", "water")),
    ("review", "Write a review of a cosy café that just opened near a park.", ("coffee", "cafe"), ("cake", "service")),
    (
        "review",
        "Write a review of a pair of walking boots after a long hike.",
        ("boots", "walking"),
        ("comfort", "trail"),
    ),
    (
        "review",
        "Write a review of a small theatre's production of a comedy.",
        ("play", "theatre"),
        ("actors", "laughter"),
    ),
    ("review", "Write a review of a board game played with friends.", ("game", "friends"), ("dice", "rules")),
    ("review", "Write a review of a city's new bike-sharing scheme.", ("bikes", "city"), ("app", "station")),
    ("speech", "Write a short speech for a school's sports day.", ("sports", "school"), ("team", "effort")),
    (
        "speech",
        "Write a short speech welcoming new members to a gardening club.",
        ("garden", "club"),
        ("seeds", "season"),
    ),
    (
        "speech",
        "Write a short speech for the opening of a community swimming pool.",
        ("pool", "community"),
        ("swim", "lessons"),
    ),
    ("speech", "Write a short toast for a friend's wedding.", ("love", "wedding"), ("couple", "future")),
    ("guide", "Write a short guide to planning a weekend camping trip.", ("camping", "tent"), ("fire", "checklist")),
    ("guide", "Write a short guide to starting a vegetable patch.", ("vegetables", "soil"), ("compost", "seeds")),
    (
        "guide",
        "Write a short guide for a first visit to a big art museum.",
        ("art", "museum"),
        ("tickets", "paintings"),
    ),
    ("guide", "Write a short guide to keeping a houseplant alive.", ("plant", "water"), ("sunlight", "pot")),
    ("guide", "Write a short guide to learning to juggle.", ("balls", "juggle"), ("practice", "rhythm")),
    (
        "opinion",
        "Write a short opinion piece on whether homework helps children learn.",
        ("homework", "children"),
        ("teachers", "evening"),
    ),
    ("opinion", "Write a short opinion piece on why towns need more trees.", ("trees", "town"), ("shade", "birds")),
    (
        "opinion",
        "Write a short opinion piece on whether cities should ban cars from their centres.",
        ("cars", "city"),
        ("pedestrians", "air"),
    ),
    (
        "opinion",
        "Write a short opinion piece on the value of learning a second language.",
        ("language", "learning"),
        ("culture", "travel"),
    ),
]

LENGTHS = (100, 150, 200)
MARKERS = ("P.S.", "P.P.S.")
END_PHRASES = ("Thank you for reading.", "That is all for today.", "Let me know what you think.",
               "Have a wonderful day!")  # fmt: skip
LETTERS = (("y", 12), ("w", 12), ("b", 8), ("k", 6), ("v", 6), ("g", 10), ("p", 10))

# instructions that cannot be kept together (a whole-JSON answer has no title line, and so on)
ALONE = {"json"}
CLASHES = {frozenset(p) for p in (("lowercase", "capitals"), ("paragraphs", "sections"), ("quoted", "end_phrase"),
                                  ("bullets", "paragraphs"), ("word_count", "letter_frequency"))}  # fmt: skip


def instruction(kind: str, rng: random.Random, likely: tuple[str, str], weave: tuple[str, str]) -> tuple[str, dict]:
    """(the sentence that asks for it, its check's arguments)."""
    if kind == "title":
        return "Give the answer a title in double angle brackets, for example <<A Good Start>>.", {}
    if kind == "postscript":
        marker = rng.choice(MARKERS)
        return f"After the main text, add a postscript that begins with {marker}", {"marker": marker}
    if kind == "placeholders":
        n = rng.choice((2, 3, 4))
        return (f"Leave at least {n} placeholders in square brackets for details to be filled in later, such as "
                "[date].", {"at_least": n})  # fmt: skip
    if kind == "bullets":
        n = rng.choice((3, 4, 5))
        return f"Use exactly {n} markdown bullet points, each on its own line starting with an asterisk.", {
            "exactly": n
        }
    if kind == "json":
        return "Give the whole answer as valid JSON, with no text before or after it.", {}
    if kind == "forbidden_words":
        return f'Do not use the words "{likely[0]}" or "{likely[1]}" anywhere.', {"words": list(likely)}
    if kind == "keywords":
        return f'Make sure the words "{weave[0]}" and "{weave[1]}" both appear.', {"words": list(weave)}
    if kind == "letter_frequency":
        letter, n = rng.choice(LETTERS)
        return f'The letter "{letter}" should appear at least {n} times.', {"letter": letter, "at_least": n}
    if kind == "word_count":
        if rng.random() < 0.5:
            n = rng.choice((120, 150, 180))
            return f"Use at least {n} words.", {"at_least": n}
        n = rng.choice((60, 80, 100))
        return f"Keep it under {n} words.", {"less_than": n}
    if kind == "lowercase":
        return "Write everything in lowercase letters, with no capital letters at all.", {}
    if kind == "capitals":
        return "Write everything in capital letters.", {}
    if kind == "no_commas":
        return "Do not use a single comma.", {}
    if kind == "end_phrase":
        phrase = rng.choice(END_PHRASES)
        return f'Finish with exactly this sentence: "{phrase}"', {"phrase": phrase}
    if kind == "quoted":
        return "Wrap the entire answer in double quotation marks.", {}
    if kind == "paragraphs":
        n = rng.choice((2, 3, 4))
        return f"Write exactly {n} paragraphs, separated by a line that holds only ***.", {"exactly": n}
    if kind == "sections":
        n = rng.choice((2, 3))
        return (f'Divide the answer into {n} sections, each starting with a line "Part 1", "Part 2" and so on.',
                {"word": "Part", "at_least": n})  # fmt: skip
    if kind == "highlights":
        n = rng.choice((2, 3))
        return f"Highlight at least {n} key phrases with markdown asterisks, like *key phrase*.", {"at_least": n}
    raise ValueError(kind)


KINDS = ("title", "postscript", "placeholders", "bullets", "json", "forbidden_words", "keywords", "letter_frequency",
         "word_count", "lowercase", "capitals", "no_commas", "end_phrase", "quoted", "paragraphs", "sections",
         "highlights")  # fmt: skip


def _kinds(rng: random.Random, count: int) -> list[str]:
    """`count` instruction kinds that can be kept together."""
    while True:
        chosen = rng.sample(KINDS, count)
        together = count == 1 or (not ALONE & set(chosen) and frozenset(chosen) not in CLASHES)
        if together:
            return chosen


def build(seed: int = SEED, count: int = COUNT) -> list[dict]:
    """`count` requests, each task in turn with one or two instructions (drawn again when a request repeats)."""
    rng = random.Random(seed)
    rows, seen = [], set()
    for i in range(count):
        task_kind, task, likely, weave = TASKS[i % len(TASKS)]
        while True:
            kinds = _kinds(rng, 1 + (i + i // len(TASKS)) % 2)
            asked = [instruction(kind, rng, likely, weave) for kind in kinds]
            length = "" if "word_count" in kinds else f" Write about {rng.choice(LENGTHS)} words."
            prompt = task + length + "".join(" " + sentence for sentence, _ in asked)
            if prompt not in seen:
                break
        seen.add(prompt)
        checks = [
            {"kind": kind, **({"args": args} if args else {})} for kind, (_, args) in zip(kinds, asked, strict=True)
        ]
        rows.append({"id": f"instruction-{i + 1:03d}", "task": task_kind, "prompt": prompt, "instructions": checks})
    return rows


def main(out_dir: str | Path | None = None) -> Path:
    out = Path(out_dir) if out_dir else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    path = out / "instructions.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in build()), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
