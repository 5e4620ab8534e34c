"""Write the general set of `finetune eval RUN --retention`: prompts a model should still answer after tuning.

    python examples/generate_retention.py            # writes finetune/ship/eval/general/{prompts,choices}.jsonl
    python examples/generate_retention.py OUT_DIR    # writes OUT_DIR/{prompts,choices}.jsonl

Seeded and standard-library only: running it again gives byte-identical files, so the committed set is what this
script says, and a change to it shows up in review. Two files:

prompts.jsonl   one prompt a line, answered greedily by the base and the tuned model, each answer checked:
                {"id", "kind", "prompt", "check"}; kind is arithmetic | conversion | fact | rule, check one of
                {"number": [values]}   a number in the answer that the prompt does not contain is one of them
                {"any_of": [terms]}    one of the terms is in the answer (whole words, any case)
                {"regex": PATTERN}     the answer matches (re.search, `.` matches newlines): the rule is followed
                A rule prompt also names its rule ({"rule": "three_words"}).
choices.jsonl   multiple-choice questions written for the project, scored by likelihood, never generated:
                {"id", "question", "lead", "options" (4), "answer" (index)}; each option is scored as the
                assistant's reply to the question, after the reply's first words `lead`.

Arithmetic, unit conversions, capitals, opposites and calendar questions use the tables and phrasings of the toy
base's pretraining corpus (generate_general.py), so the toy base can answer them; the other facts, the rules and
most multiple-choice questions are general knowledge a real base (SmolLM2-135M-Instruct) has. None of these prompts
is in the bundled team's data (train.jsonl, test.jsonl, prefs.jsonl): tests/unit/ship/eval/test_general_set.py checks it.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import sys
from pathlib import Path

SEED = 23
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "finetune" / "ship" / "eval" / "general"


def _general_tables():
    """The toy base's own tables (capitals, opposites, units, days), read from its corpus generator."""
    spec = importlib.util.spec_from_file_location("generate_general", HERE / "generate_general.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ open prompts

# General knowledge: (prompt, check). Terms are matched as whole words in any case; numbers also as words.
FACTS: list[tuple[str, dict]] = [
    ("Which planet is the largest in our solar system?", {"any_of": ["Jupiter"]}),
    ("Which planet is known as the Red Planet?", {"any_of": ["Mars"]}),
    ("Which planet is closest to the Sun?", {"any_of": ["Mercury"]}),
    ("What is the largest ocean on Earth?", {"any_of": ["Pacific"]}),
    ("What is the tallest mountain in the world?", {"any_of": ["Everest"]}),
    ("Who wrote the play Romeo and Juliet?", {"any_of": ["Shakespeare"]}),
    ("Who painted the Mona Lisa?", {"any_of": ["Leonardo", "da Vinci"]}),
    ("Who was the first person to walk on the Moon?", {"any_of": ["Armstrong"]}),
    ("What is the chemical symbol for gold?", {"any_of": ["Au"]}),
    ("What is the chemical symbol for iron?", {"any_of": ["Fe"]}),
    ("What is the chemical formula of water?", {"any_of": ["H2O", "H₂O"]}),
    ("Which gas do plants take in from the air to make their food?", {"any_of": ["carbon dioxide", "CO2", "CO₂"]}),
    ("Which organ pumps blood around the human body?", {"any_of": ["heart"]}),
    ("What is the largest mammal on Earth?", {"any_of": ["blue whale"]}),
    ("What is the currency of Japan?", {"any_of": ["yen"]}),
    ("What language is mainly spoken in Brazil?", {"any_of": ["Portuguese"]}),
    ("What is the hardest natural substance?", {"any_of": ["diamond", "diamonds"]}),
    ("Which insect makes honey?", {"any_of": ["bee", "bees", "honeybee", "honeybees"]}),
    ("On which continent is Egypt?", {"any_of": ["Africa"]}),
    ("What is the largest country in the world by area?", {"any_of": ["Russia"]}),
    ("What is the capital of the United States?", {"any_of": ["Washington"]}),
    ("What is the capital of the United Kingdom?", {"any_of": ["London"]}),
    ("Which star is at the centre of our solar system?", {"any_of": ["Sun"]}),
    ("What do we call water when it is frozen?", {"any_of": ["ice"]}),
    ("What colour do you get by mixing blue and yellow?", {"any_of": ["green"]}),
    ("What is the longest river in Africa?", {"any_of": ["Nile"]}),
    ("Which animal is known as the king of the jungle?", {"any_of": ["lion", "lions"]}),
    ("What is the main language spoken in Mexico?", {"any_of": ["Spanish"]}),
    ("Which metal is liquid at room temperature?", {"any_of": ["mercury"]}),
    ("Who developed the theory of relativity?", {"any_of": ["Einstein"]}),
    ("How many legs does a spider have?", {"number": [8]}),
    ("How many continents are there on Earth?", {"number": [7]}),
    ("How many days are there in a week?", {"number": [7]}),
    ("At what temperature in degrees Celsius does water boil at sea level?", {"number": [100]}),
    ("At what temperature in degrees Celsius does water freeze?", {"number": [0]}),
    ("How many sides does a hexagon have?", {"number": [6]}),
    ("How many degrees are there in a right angle?", {"number": [90]}),
    ("How many players does a football team have on the field?", {"number": [11]}),
    ("In which year did the Second World War end?", {"number": [1945]}),
    ("How many hours are there in a day?", {"number": [24]}),
    ("What is the smallest prime number?", {"number": [2]}),
    ("How many minutes are there in an hour?", {"number": [60]}),
    ("How many months are there in a year?", {"number": [12]}),
    ("What is the square root of 81?", {"number": [9]}),
    ("How many bones are there in the adult human body?", {"number": [206]}),
    ("How many strings does a standard guitar have?", {"number": [6]}),
]

# Capitals, opposites and days the toy knows, with the other names a person would accept.
CAPITAL_ALSO = {"Brasilia": ["Brasília"], "New Delhi": ["Delhi"]}
OPPOSITE_ALSO = {
    "closed": ["shut"],
    "expensive": ["costly", "dear"],
    "loud": ["noisy"],
    "sad": ["unhappy"],
    "leave": ["depart"],
    "refuse": ["reject", "decline"],
    "finish": ["end"],
    "begin": ["start"],
    "light": ["lightweight"],
}

# A word: a run of non-spaces with a letter or digit in it ("it's", "sea-side,"; not "--" or "...").
WORD = r"[^\s]*[A-Za-z0-9][^\s]*"
# Instructions with a rule the answer can be checked against: (rule, instruction, pattern).
RULES: list[tuple[str, str, str]] = [
    ("three_words", "Answer in exactly three words.", rf"^\s*{WORD}\s+{WORD}\s+{WORD}\s*$"),
    ("one_word", "Answer with one word only.", rf"^\s*{WORD}\s*$"),
    ("at_most_five_words", "Answer in five words or fewer.", rf"^\s*{WORD}(\s+{WORD}){{0,4}}\s*$"),
    ("lowercase", "Reply in lowercase letters only, with no capital letters.", r"^[^A-Z]*[a-z][^A-Z]*$"),
    ("uppercase", "Reply in capital letters only.", r"^[^a-z]*[A-Z][^a-z]*$"),
    ("ends_with_question", "End your reply with a question.", r"\?[\"'”’)\s]*$"),
    ("starts_with_sure", 'Begin your reply with the word "Sure".', r"^\W*Sure\b"),
    ("no_commas", "Do not use any commas in your reply.", r"^[^,]*\w[^,]*$"),
    ("in_quotes", "Put your whole reply inside double quotation marks.", r"^\s*[\"“].*[\"”]\s*$"),
    (
        "numbered_three",
        "Answer with a numbered list of exactly three items.",
        r"^\s*1[.)][^\n]*\n\s*2[.)][^\n]*\n\s*3[.)][^\n]*\s*$",
    ),
]
# Yes/no and word rules need their own questions.
YES_NO_RULE = ("starts_yes_no", "Start your answer with Yes or No.", r"^\W*(?:yes|no)\b")
WORD_RULE = ("uses_word", 'Use the word "{word}" in your reply.', r"(?i)\b{word}\b")
QUESTIONS = [
    "What is the weather usually like in summer?",
    "Name an animal that lives in the sea.",
    "What do people use an umbrella for?",
    "Name a fruit that grows on trees.",
    "What is a bicycle used for?",
    "Describe a cat.",
    "What do you need to bake bread?",
    "Why do people drink water?",
    "Name a colour of the rainbow.",
    "What is a good way to relax in the evening?",
]
LIST_QUESTIONS = [
    "Name some fruits.",
    "What can you find in a kitchen?",
    "Name some animals that live on a farm.",
    "What should you pack for a beach trip?",
    "Name some vegetables.",
]
YES_NO_QUESTIONS = [
    "Is the sun hot?",
    "Can fish swim?",
    "Do birds have feathers?",
    "Is the sea salty?",
    "Can a cat fly?",
]
WORDS = [("blue", "Describe the sky."), ("morning", "When do you like to go for a walk?"), ("green", "Describe a park."),
         ("quickly", "How does a cheetah run?"), ("warm", "Describe a summer day.")]  # fmt: skip
PER_RULE = 5


def _numbers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", text)}


def _arithmetic(rng: random.Random, count: int) -> list[tuple[str, dict]]:
    items, seen = [], set()
    while len(items) < count:
        op = ("plus", "minus", "times")[len(items) % 3]
        a, b = rng.randint(2, 99), rng.randint(2, 99 if op != "times" else 12)
        if op == "minus" and b > a:
            a, b = b, a
        result = {"plus": a + b, "minus": a - b, "times": a * b}[op]
        phrasing = rng.choice(
            [f"What is {a} {op} {b}?", f"Calculate {a} {dict(plus='+', minus='-', times='x')[op]} {b}."]
        )
        if result in (a, b) or (a, b, op) in seen:  # the answer must not be a number the prompt already shows
            continue
        seen.add((a, b, op))
        items.append((phrasing, {"number": [result]}))
    return items


def _conversions(rng: random.Random, tables, count: int) -> list[tuple[str, dict]]:
    items, seen = [], set()
    while len(items) < count:
        small, big, factor = tables.CONVERSIONS[len(items) % len(tables.CONVERSIONS)]
        n = rng.randint(2, 12)
        if (small, n) in seen:
            continue
        seen.add((small, n))
        prompt = rng.choice([f"How many {small} are in {n} {big}?", f"Convert {n} {big} to {small}."])
        items.append((prompt, {"number": [n * factor]}))
    return items


def _toy_facts(rng: random.Random, tables, countries: list[str], opposites: list[tuple[str, str]], days: list[int]):
    items = []
    for country in countries:
        capital = tables.COUNTRIES[country]
        items.append((f"What is the capital of {country}?", {"any_of": [capital, *CAPITAL_ALSO.get(capital, [])]}))
    for word, other in opposites:
        items.append((f"What is the opposite of {word}?", {"any_of": [other, *OPPOSITE_ALSO.get(other, [])]}))
    for i in days:
        items.append((f"What day comes after {tables.DAYS[i]}?", {"any_of": [tables.DAYS[(i + 1) % 7]]}))
    for month, length in tables.MONTHS:
        accepted = [28, 29] if month == "February" else [length]
        items.append((f"How many days are in {month}?", {"number": accepted}))
    return items


def _rules() -> list[tuple[str, str, str]]:
    """(rule, prompt, pattern): each rule on PER_RULE different questions."""
    items = []
    for k, (rule, instruction, pattern) in enumerate(RULES):
        questions = LIST_QUESTIONS if rule == "numbered_three" else QUESTIONS
        for j in range(PER_RULE):
            question = questions[(k + j) % len(questions)]
            items.append((rule, f"{instruction} {question}", pattern))
    rule, instruction, pattern = YES_NO_RULE
    items += [(rule, f"{instruction} {q}", "(?i)" + pattern) for q in YES_NO_QUESTIONS]
    rule, instruction, pattern = WORD_RULE
    items += [(rule, f"{instruction.format(word=w)} {q}", pattern.format(word=w)) for w, q in WORDS]
    return items


# ------------------------------------------------------------------------------------------------ multiple choice

# (question, lead, right answer, three wrong ones): general knowledge, written for this set.
CHOICES: list[tuple[str, str, str, list[str]]] = [
    ("Which gas makes up most of the air we breathe?", "Most of the air we breathe is", "nitrogen",
     ["oxygen", "carbon dioxide", "helium"]),
    ("At what temperature does water boil at sea level, in degrees Fahrenheit?", "At sea level, water boils at",
     "212 degrees Fahrenheit", ["100 degrees Fahrenheit", "32 degrees Fahrenheit", "150 degrees Fahrenheit"]),
    ("Which planet is famous for its large rings?", "The planet famous for its large rings is", "Saturn",
     ["Mars", "Venus", "Mercury"]),
    ("Who wrote the novel Pride and Prejudice?", "Pride and Prejudice was written by", "Jane Austen",
     ["Charles Dickens", "Mark Twain", "Leo Tolstoy"]),
    ("What is the largest desert in Africa?", "The largest desert in Africa is the", "Sahara",
     ["Gobi", "Atacama", "Mojave"]),
    ("Which organs do humans breathe with?", "Humans breathe with their", "lungs", ["kidneys", "liver", "stomach"]),
    ("How many sides does a triangle have?", "A triangle has", "three sides", ["four sides", "five sides", "six sides"]),
    ("At what temperature does water freeze, in degrees Celsius?", "Water freezes at", "0 degrees Celsius",
     ["10 degrees Celsius", "50 degrees Celsius", "100 degrees Celsius"]),
    ("Which animal is the tallest in the world?", "The tallest animal in the world is the", "giraffe",
     ["elephant", "horse", "camel"]),
    ("Which star is closest to Earth?", "The star closest to Earth is", "the Sun",
     ["Sirius", "Polaris", "Betelgeuse"]),
    ("On which continent is Brazil?", "Brazil is in", "South America", ["Africa", "Asia", "Europe"]),
    ("What is the main ingredient of guacamole?", "The main ingredient of guacamole is", "avocado",
     ["potato", "banana", "cucumber"]),
    ("Which instrument has 88 keys?", "The instrument with 88 keys is the", "piano", ["guitar", "violin", "trumpet"]),
    ("What do bees collect from flowers?", "Bees collect", "nectar", ["sand", "stones", "salt"]),
    ("What is the largest bone in the human body?", "The largest bone in the human body is the", "femur",
     ["kneecap", "collarbone", "jawbone"]),
    ("Who described the laws of motion and universal gravitation?", "The laws of motion and gravitation were described by",
     "Isaac Newton", ["Charles Darwin", "Louis Pasteur", "William Shakespeare"]),
    ("Which ocean lies between Europe and North America?", "The ocean between Europe and North America is the",
     "Atlantic", ["Pacific", "Indian", "Arctic"]),
    ("What is the opposite direction of north?", "The opposite direction of north is", "south",
     ["east", "west", "up"]),
    ("How many days are there in a leap year?", "A leap year has", "366 days", ["365 days", "364 days", "360 days"]),
    ("What are electrical wires in homes usually made of?", "Electrical wires in homes are usually made of", "copper",
     ["wood", "glass", "paper"]),
    ("What is the main source of energy for life on Earth?", "The main source of energy for life on Earth is",
     "the Sun", ["the Moon", "volcanoes", "the wind"]),
    ("What does a thermometer measure?", "A thermometer measures", "temperature", ["weight", "distance", "speed"]),
    ("What is a glacier made of?", "A glacier is made of", "ice", ["sand", "wood", "metal"]),
    ("Which shape has four equal sides and four right angles?", "A shape with four equal sides and four right angles is a",
     "square", ["triangle", "circle", "pentagon"]),
    ("What colour are ripe bananas?", "Ripe bananas are", "yellow", ["blue", "purple", "grey"]),
    ("Which bird is a symbol of peace?", "The bird that is a symbol of peace is the", "dove",
     ["crow", "vulture", "penguin"]),
    ("What do caterpillars turn into?", "Caterpillars turn into", "butterflies", ["frogs", "spiders", "fish"]),
    ("What do plants need from sunlight to make food?", "Plants use sunlight to make food through", "photosynthesis",
     ["digestion", "evaporation", "erosion"]),
]  # fmt: skip


def _toy_choices(rng: random.Random, tables, countries, opposites, days) -> list[tuple[str, str, str, list[str]]]:
    capitals = list(tables.COUNTRIES.values())
    items = []
    for country in countries:
        right = tables.COUNTRIES[country]
        wrong = rng.sample([c for c in capitals if c != right], 3)
        items.append((f"Which city is the capital of {country}?", f"The capital of {country} is", right, wrong))
    others = [w for pair in tables.OPPOSITES.items() for w in pair]
    for word, other in opposites:
        wrong = rng.sample([w for w in others if w not in (word, other)], 3)
        items.append((f"Give me an antonym for {word}.", f"The opposite of {word} is", other, wrong))
    for i in days:
        right = tables.DAYS[(i + 1) % 7]
        wrong = rng.sample([d for d in tables.DAYS if d not in (right, tables.DAYS[i])], 3)
        items.append((f"Which day follows {tables.DAYS[i]}?", f"The day after {tables.DAYS[i]} is", right, wrong))
    return items


# ------------------------------------------------------------------------------------------------ the set


def build(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(prompts, choices): the same lists for the same seed."""
    rng = random.Random(seed)
    tables = _general_tables()
    countries = list(tables.COUNTRIES)
    rng.shuffle(countries)
    pairs = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in tables.OPPOSITES.items()]
    rng.shuffle(pairs)
    days = list(range(7))
    rng.shuffle(days)
    # the open prompts and the multiple-choice questions ask about different countries, words and days
    open_facts = _toy_facts(rng, tables, countries[:20], pairs[:15], days[:4])

    prompts: list[dict] = []
    groups = [
        ("arithmetic", _arithmetic(rng, 72)),
        ("conversion", _conversions(rng, tables, 36)),
        ("fact", open_facts + FACTS),
    ]
    for kind, items in groups:
        for i, (prompt, check) in enumerate(items, start=1):
            prompts.append({"id": f"{kind}-{i:03d}", "kind": kind, "prompt": prompt, "check": check})
    for i, (rule, prompt, pattern) in enumerate(_rules(), start=1):
        prompts.append(
            {"id": f"rule-{i:03d}", "kind": "rule", "rule": rule, "prompt": prompt, "check": {"regex": pattern}}
        )

    choices: list[dict] = []
    toy = _toy_choices(rng, tables, countries[20:30], pairs[15:20], days[4:7])
    questions = toy + CHOICES
    slots = [i % 4 for i in range(len(questions))]  # the right answer in each position equally often
    rng.shuffle(slots)
    for i, ((question, lead, right, wrong), slot) in enumerate(zip(questions, slots, strict=True), start=1):
        options = rng.sample(wrong, 3)
        options.insert(slot, right)
        choices.append(
            {
                "id": f"choice-{i:03d}",
                "question": question,
                "lead": lead,
                "options": options,
                "answer": options.index(right),
            }
        )
    _check(prompts, choices)
    return prompts, choices


def _check(prompts: list[dict], choices: list[dict]) -> None:
    """The set's own promises: unique prompts, compiled rules, answers the prompt does not give away."""
    texts = [p["prompt"] for p in prompts] + [c["question"] for c in choices]
    assert len(texts) == len(set(texts)), "a prompt appears twice"
    for item in prompts:
        check = item["check"]
        if "regex" in check:
            re.compile(check["regex"])
        if "number" in check:
            assert not set(check["number"]) & _numbers(item["prompt"]), item
        for term in check.get("any_of", []):
            assert not re.search(rf"(?<!\w){re.escape(term)}(?!\w)", item["prompt"], re.I), item
    for item in choices:
        assert len(item["options"]) == 4 and len(set(item["options"])) == 4, item


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main(out_dir: str | Path | None = None) -> list[Path]:
    out = Path(out_dir) if out_dir else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    prompts, choices = build()
    _write(out / "prompts.jsonl", prompts)
    _write(out / "choices.jsonl", choices)
    return [out / "prompts.jsonl", out / "choices.jsonl"]


if __name__ == "__main__":
    for path in main(sys.argv[1] if len(sys.argv) > 1 else None):
        print(f"wrote {path}")
