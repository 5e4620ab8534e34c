"""Write finetune/data/replay/prompts.jsonl: the general requests self-replay asks the base model to answer.

Written for self-replay alone: its subjects and phrasings are this file's own, not those of the retention check's
general set (examples/generate_retention.py), which must stay an independent measure; tests/unit/data/
test_replay_prompts.py checks that no prompt overlaps that set, whole or in part.

    python examples/make_replay_prompts.py      # rewrites the file (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "finetune" / "data" / "replay" / "prompts.jsonl"

POEM_TOPICS = [
    "a lighthouse keeper",
    "autumn leaves",
    "a cat asleep on a windowsill",
    "the first snow",
    "a busy kitchen",
    "an old wooden boat",
    "a thunderstorm at night",
    "a garden after rain",
    "a train crossing the plains",
    "a lost umbrella",
    "morning coffee",
    "a quiet library corner",
    "a kite on a windy hill",
    "fireflies",
    "a grandmother's recipe book",
    "the sound of the sea",
    "a city waking up",
    "a snail's slow journey",
]
POEM_FORMS = ["a short poem", "a four-line poem", "a haiku", "a limerick", "a rhyming couplet"]
LIST_ITEMS = [
    "things to pack for a weekend camping trip",
    "ways to save water at home",
    "indoor hobbies for a rainy day",
    "vegetables that grow well in pots",
    "tips for a good night's sleep",
    "board games families enjoy",
    "questions to ask at a job interview",
    "ways to stay focused while studying",
    "easy breakfast ideas",
    "habits that help keep a desk tidy",
    "items for a basic first-aid kit",
    "reasons people keep a journal",
    "ways to reuse glass jars",
    "things to check before a long drive",
    "birds you might see in a park",
    "ideas for a child's birthday party",
    "stretches to do after sitting for hours",
    "uses for baking soda",
]
RIDDLE_ANSWERS = [
    "a shadow",
    "an echo",
    "a candle",
    "a clock",
    "a towel",
    "a keyboard",
    "a map",
    "a sponge",
    "footsteps",
    "a staircase",
    "a pillow",
    "an egg",
    "a mirror",
    "a comb",
    "a zipper",
    "a needle",
]
HOWTOS = [
    "plant tomato seeds",
    "fold a paper airplane",
    "make a cup of tea",
    "tie a simple knot for a shoelace",
    "clean a frying pan",
    "write a shopping list that saves money",
    "repot a houseplant",
    "iron a shirt",
    "make a simple salad dressing",
    "wash a wool sweater by hand",
    "prepare for a short presentation",
    "back up photos from a phone",
    "change a flat bicycle tyre",
    "start a compost heap",
    "brew filter coffee",
    "make pancakes from scratch",
    "hang a picture straight",
    "plan a week of meals",
]
WORDS = [
    "nostalgia",
    "curiosity",
    "erosion",
    "photosynthesis",
    "a metaphor",
    "inflation",
    "a haiku",
    "gravity",
    "empathy",
    "a delta",
    "fermentation",
    "an alibi",
    "a palindrome",
    "a compass",
    "migration",
    "a thesaurus",
    "camouflage",
    "an orchestra",
    "friction",
    "a proverb",
]
PASSAGES = [
    "Maria missed the early bus, so she walked to work. On the way she found a small bakery that had just opened, "
    "bought a warm roll, and arrived only ten minutes late, in a better mood than usual.",
    "The town council voted to close the main square to cars on Sundays. Shop owners worried at first, but after "
    "two months they reported more visitors, and families now picnic where cars used to park.",
    "A group of students planted fifty trees along the river. They water them every week in summer, and they "
    "measure how tall each tree has grown at the end of every school term.",
    "Tom wanted to learn the violin at sixty. He practised twenty minutes a day, joined a beginners' group, and "
    "after a year he played a short piece at his granddaughter's wedding.",
    "The museum moved its dinosaur skeleton to a larger hall. It took three weeks, a crane and forty careful "
    "workers, and the skeleton now stands upright for the first time in decades.",
    "Heavy rain flooded the village road overnight. Neighbours brought sandbags, cleared the drains together, "
    "and by the evening the water had gone and the school bus could pass again.",
    "A small company let its staff choose their own working hours. Fewer people were late, meetings moved to "
    "the middle of the day, and the team said they felt less tired by Friday.",
    "Lena's tomato plants kept wilting. She moved them to a sunnier spot, watered them in the morning instead "
    "of at night, and within two weeks the first red tomatoes appeared.",
    "The library started lending tools such as drills and ladders. Within a month, most of the tools were "
    "borrowed every weekend, and people began donating their spare ones.",
    "An old cinema was about to be demolished. Local residents raised money, repaired the seats and the "
    "projector, and the cinema now shows a classic film every Friday night.",
]
TRANSLATE = [
    "Good morning, how did you sleep?",
    "The shop closes at six o'clock.",
    "I would like a glass of water, please.",
    "My brother plays the piano.",
    "Where is the nearest train station?",
    "It is raining again today.",
    "We are going to the beach tomorrow.",
    "This soup is too hot.",
    "Thank you for your help yesterday.",
    "The children are reading in the garden.",
    "I forgot my keys at home.",
    "Can you speak more slowly?",
]
LANGUAGES = ["French", "Spanish", "German", "Italian"]
PAIRS = [
    ("weather", "climate"),
    ("a virus", "a bacterium"),
    ("a lake", "a pond"),
    ("baking", "roasting"),
    ("a simile", "a metaphor"),
    ("speed", "velocity"),
    ("a town", "a city"),
    ("jogging", "sprinting"),
    ("a crocodile", "an alligator"),
    ("borrowing", "lending"),
    ("a hurricane", "a tornado"),
    ("a herb", "a spice"),
]
NOTES = [
    ("a neighbour", "watering your plants while you were away"),
    ("a teacher", "extra help before an exam"),
    ("a friend", "a birthday present"),
    ("a colleague", "covering your shift"),
    ("a cousin", "a lift to the airport"),
    ("a coach", "a great season"),
    ("a host", "a lovely dinner"),
    ("a nurse", "kind care in hospital"),
]
STORIES = [
    ("a robot", "learns to bake bread"),
    ("a shy dragon", "makes its first friend"),
    ("a lost penguin", "finds home"),
    ("a girl with a red bicycle", "wins a race she did not plan to enter"),
    ("an old fisherman", "catches a boot"),
    ("a cloud", "wants to see the desert"),
    ("a mouse in a museum", "guards a painting"),
    ("two rival chefs", "cook one meal together"),
    ("a tortoise", "learns to skateboard"),
]


def _arithmetic(rng: random.Random) -> list[str]:
    made = []
    for _ in range(72):
        a, b, c = rng.randint(3, 48), rng.randint(2, 12), rng.randint(10, 90)
        made.append(
            rng.choice(
                [
                    f"A baker makes {a} loaves each hour for {b} hours. How many loaves is that? Show the working.",
                    f"I had {a + c} stickers and gave away {c}. How many do I have left? Explain briefly.",
                    f"A ticket costs {b} euros. How much do {a} tickets cost altogether? Show your steps.",
                    f"Share {a * b} sweets equally among {b} children. How many does each child get?",
                    f"A train leaves at 9:{c % 60:02d} and the trip takes {a} minutes. When does it arrive?",
                    f"A garden is {a} metres long and {b} metres wide. Work out its area step by step.",
                ]
            )
        )
    return made


# Everyday requests that ask for a form as well as content: what a general assistant is asked every day, so replay
# rehearses the base following the form a request asks for, not only answering it. Subjects and wording are this
# file's own (the retention check's instruction requests, examples/generate_instructions.py, are another set).
FORM_TASKS = [
    "a short note to a flatmate about sharing the chores",
    "an invitation to a neighbourhood clean-up day",
    "a description of a favourite walking route",
    "advice for someone who wants to start running",
    "a welcome message for a new member of a choir",
    "a plan for sorting out a cluttered garage",
    "an introduction to growing herbs on a windowsill",
    "an explanation of how a compass works",
    "a few words on why soup is a good winter meal",
    "tips for taking better photos with a phone",
    "a message asking a colleague to swap a shift",
    "a description of a small winter market",
    "a reminder to a book club about its next meeting",
    "an explanation of why bread goes stale",
    "advice on keeping a fish tank clean",
    "a message to a landlord about a dripping tap",
    "a short account of learning to swim as an adult",
    "a guide to packing a suitcase neatly",
    "an explanation of how a dishwasher gets plates clean",
    "a welcome note for guests staying in a holiday flat",
]
FORM_WORDS = {  # a task's word to leave out, and two to work in
    "chores": ("chores", ("rota", "kitchen")),
    "clean-up": ("litter", ("gloves", "park")),
    "walking": ("walk", ("bench", "hill")),
    "running": ("run", ("shoes", "pace")),
    "choir": ("sing", ("rehearsal", "songs")),
    "garage": ("boxes", ("shelves", "weekend")),
    "herbs": ("herbs", ("basil", "sunlight")),
    "compass": ("north", ("needle", "magnet")),
    "soup": ("soup", ("vegetables", "bowl")),
    "photos": ("camera", ("light", "angle")),
    "shift": ("shift", ("Friday", "favour")),
    "market": ("market", ("stalls", "lanterns")),
    "book club": ("book", ("chapter", "tea")),
    "bread": ("bread", ("starch", "moisture")),
    "fish tank": ("water", ("filter", "gravel")),
    "tap": ("tap", ("plumber", "washer")),
    "swim": ("swim", ("pool", "breath")),
    "suitcase": ("clothes", ("rolling", "shoes")),
    "dishwasher": ("water", ("spray", "detergent")),
    "holiday flat": ("flat", ("keys", "wifi")),
}
FORM_ASKS = [
    "Set it out as {n} bullet points, one per line, each starting with a dash.",
    'Reply only with a JSON object that has the keys "title" and "text".',
    "Sign it off, then add a short P.S. line at the very end.",
    "Leave blanks in square brackets, like [name], wherever a personal detail would go.",
    "Use only lowercase letters, even at the start of sentences.",
    "Type the whole reply in upper case.",
    "Avoid commas entirely in your reply.",
    "Keep the whole reply below {words} words.",
    "Start with a short title on a line of its own.",
    'Do it without ever using the word "{avoid}".',
    "End the reply with a question to the reader.",
    "Number the steps 1, 2, 3 and so on.",
    "Split it into exactly two paragraphs.",
    "Put the whole reply inside double quotes.",
    'Work the words "{a}" and "{b}" into it.',
]


def _form_requests(rng: random.Random) -> list[str]:
    """Each everyday task with six of the form asks, one ask each (a length hint unless the ask is a length)."""
    made = []
    for task in FORM_TASKS:
        avoid, (a, b) = next(words for key, words in FORM_WORDS.items() if key in task)
        for ask in rng.sample(FORM_ASKS, 6):
            text = ask.format(n=rng.randint(3, 5), words=rng.choice((60, 80, 100)), avoid=avoid, a=a, b=b)
            length = "" if "{words}" in ask else f" About {rng.choice((80, 100, 120))} words."
            made.append(f"Could you write {task}?{length} {text}")
    return made


def prompts() -> list[dict]:
    rng = random.Random(34)
    made: list[tuple[str, str]] = []
    for topic in POEM_TOPICS:
        for form in rng.sample(POEM_FORMS, 2):
            made.append(("poem", f"Please write {form} about {topic}."))
    for items in LIST_ITEMS:
        made.append(("list", f"Give me a bulleted list of {rng.randint(3, 6)} {items}."))
    for answer in RIDDLE_ANSWERS:
        made.append(("riddle", f"Invent a riddle for kids whose solution is {answer}, then give the solution."))
    made += [("arithmetic", text) for text in _arithmetic(rng)]
    for task in HOWTOS:
        made.append(("how-to", f"Walk me through how to {task}, in a few short steps."))
        made.append(("how-to", f"I have never tried to {task}. What should I do first, and then?"))
    for word in WORDS:
        made.append(("definition", f"Could you explain what {word} means, with one everyday example?"))
        made.append(("definition", f"In plain words for a ten-year-old: what is {word}?"))
    for passage in PASSAGES:
        made.append(("summary", f"Sum up the following text in a single sentence.\n\n{passage}"))
        made.append(("summary", f"Give this story a short title and a one-line moral.\n\n{passage}"))
    for sentence in TRANSLATE:
        for language in rng.sample(LANGUAGES, 3):
            made.append(("translation", f'Please translate into {language}: "{sentence}"'))
    for a, b in PAIRS:
        made.append(("comparison", f"How do {a} and {b} differ? Keep it to two or three sentences."))
    for person, reason in NOTES:
        made.append(("note", f"Draft a warm, short thank-you message to {person} for {reason}."))
    for hero, plot in STORIES:
        made.append(("story", f"Tell me a tiny bedtime story in which {hero} {plot}."))
    made += [("form", text) for text in _form_requests(random.Random(41))]  # after the rest: their ids stay
    seen, rows = set(), []
    for kind, text in made:
        if text not in seen:
            seen.add(text)
            rows.append({"id": f"replay-{len(rows) + 1:03d}", "kind": kind, "prompt": text})
    return rows


def main() -> None:
    rows = prompts()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()
