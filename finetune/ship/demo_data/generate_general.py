"""Generate a general-purpose chat corpus in a neutral voice: the pretraining data of the toy base model.

`finetune toy-model DIR --pretrain` pretrains the tiny model on this corpus, so that before any fine-tuning
it already answers requests plainly: arithmetic, unit conversions, capitals, word meanings, opposites, dates,
sorting, everyday how-tos, and account or home-internet questions. The answers are correct (computed, or
taken from a fixed table) and neutral: no greeting line, no sign-off, no team name, none of the phrasing of
the support team in `generate.py`. Nothing here is read from `train.jsonl` or `test.jsonl`.

    python examples/generate_general.py            # writes general.jsonl next to this file
    python examples/generate_general.py OUT_DIR    # writes OUT_DIR/general.jsonl

`generate(count, seed)` returns the same conversations in memory (the toy builder calls it); the same
arguments always give the same conversations.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

SEED = 7
COUNT = 3000
SYSTEM_SHARE = 0.15
MULTI_TURN_SHARE = 0.15

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly and plainly.",
    "Answer the user's question.",
    "You are an assistant that helps with everyday questions.",
]
OPENERS = ["", "", "", "", "Hi, ", "Hello, ", "Hey, ", "Quick question: ", "Please help: "]
CLOSERS = ["", "", "", "", " Thanks.", " Thank you!", " thanks", " Please."]

NUMBER_WORDS = {"plus": "+", "minus": "-", "times": "x"}
COUNTRIES = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Poland": "Warsaw",
    "Greece": "Athens",
    "Ireland": "Dublin",
    "Austria": "Vienna",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "India": "New Delhi",
    "China": "Beijing",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Turkey": "Ankara",
    "Brazil": "Brasilia",
    "Denmark": "Copenhagen",
    "Belgium": "Brussels",
    "Hungary": "Budapest",
}
DEFINITIONS = {
    "library": "a place where books and other media are kept for people to read or borrow",
    "bridge": "a structure built to carry a road or path over a river, a valley or another road",
    "recipe": "a set of instructions for making a dish, with the ingredients and the steps",
    "invoice": "a document that lists what was sold or provided and the amount to be paid",
    "password": "a secret word or phrase that proves who you are when you sign in",
    "router": "a device that connects the computers and phones in a home to each other and to the internet",
    "bandwidth": "the amount of data a connection can carry in a given time, usually given in megabits per second",
    "refund": "money paid back to a customer, for example after a product is returned",
    "subscription": "an arrangement to pay regularly, for example every month, to keep using a service",
    "calendar": "a chart or app that shows the days, weeks and months of the year",
    "volcano": "a mountain with an opening through which lava, ash and gas come out",
    "planet": "a large round body that moves in an orbit around a star",
    "harbour": "a sheltered area of water where ships and boats can stay safely",
    "orchard": "a piece of land where fruit trees are grown",
    "thermometer": "an instrument that measures temperature",
    "glacier": "a large, slow-moving mass of ice formed from snow over many years",
    "budget": "a plan for how much money will be earned and spent over a period",
    "receipt": "a written record that something has been paid for",
    "battery": "a device that stores energy and supplies it as electricity",
    "cable": "a thick wire, or a group of wires, that carries electricity or signals",
    "deadline": "the latest time or date by which something must be done",
    "email": "a message sent electronically from one person to another over the internet",
    "browser": "a program used to open and read pages on the web",
    "spreadsheet": "a program that arranges numbers and text in rows and columns and can calculate with them",
    "meeting": "a planned occasion when people come together to discuss something",
}
OPPOSITES = {
    "hot": "cold",
    "early": "late",
    "fast": "slow",
    "open": "closed",
    "full": "empty",
    "heavy": "light",
    "high": "low",
    "strong": "weak",
    "cheap": "expensive",
    "quiet": "loud",
    "young": "old",
    "wide": "narrow",
    "happy": "sad",
    "buy": "sell",
    "arrive": "leave",
    "accept": "refuse",
    "increase": "decrease",
    "inside": "outside",
    "begin": "finish",
    "remember": "forget",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    ("January", 31),
    ("February", 28),
    ("March", 31),
    ("April", 30),
    ("May", 31),
    ("June", 30),
    ("July", 31),
    ("August", 31),
    ("September", 30),
    ("October", 31),
    ("November", 30),
    ("December", 31),
]
CONVERSIONS = [  # (unit asked, unit given, factor, plural phrase)
    ("minutes", "hours", 60),
    ("seconds", "minutes", 60),
    ("hours", "days", 24),
    ("days", "weeks", 7),
    ("grams", "kilograms", 1000),
    ("metres", "kilometres", 1000),
    ("centimetres", "metres", 100),
    ("millilitres", "litres", 1000),
    ("months", "years", 12),
]
HOWTOS = [
    (
        ["How do I boil an egg?", "what's the way to boil an egg", "Can you tell me how to boil an egg?"],
        "Put the egg in a pot, cover it with cold water and bring it to a boil. Then simmer it for 7 minutes "
        "for a firm yolk, and cool it in cold water before peeling.",
    ),
    (
        ["How do I make a cup of tea?", "how to make tea", "What are the steps to make tea?"],
        "1. Boil fresh water.\n2. Pour it over a tea bag in a cup and wait 3 to 5 minutes.\n3. Remove the bag "
        "and add milk or sugar if you like.",
    ),
    (
        ["How do I take a screenshot on a laptop?", "how can I capture my screen", "How to take a screenshot?"],
        "On Windows, press the Windows key, Shift and S together and choose an area. On a Mac, press Command, "
        "Shift and 4, then drag over the area. The image is saved or copied for you.",
    ),
    (
        ["How do I write a polite email asking for a day off?", "help me ask my manager for a day off by email"],
        "Keep it short: say which day you would like off and why, mention how your work will be covered, and "
        "thank your manager. Send it a few days in advance if you can.",
    ),
    (
        ["How can I save battery on my phone?", "my phone battery runs out fast, what can I do"],
        "Lower the screen brightness, turn off Bluetooth and location when you do not need them, and close "
        "apps that run in the background. Battery saver mode in the settings does most of this for you.",
    ),
    (
        ["How do I make a strong password?", "what makes a good password", "Tips for a safe password?"],
        "Use at least 12 characters, mix words, numbers and symbols, and never reuse a password on two sites. "
        "A password manager can create and remember strong passwords for you.",
    ),
    (
        ["How do I clear my browser cache?", "how to empty the cache in my browser"],
        "Open the browser settings, go to Privacy, and choose Clear browsing data. Tick cached images and "
        "files, pick a time range, and confirm.",
    ),
    (
        ["How do I restart my computer?", "what's the right way to reboot a computer"],
        "Save your work and close your programs first. Then open the start or Apple menu and choose Restart.",
    ),
    (
        ["How long should I water a small garden?", "how much water does a small garden need"],
        "Water deeply two or three times a week rather than a little every day, about 20 minutes each time, "
        "early in the morning so less water evaporates.",
    ),
    (
        ["How do I back up my photos?", "what's a good way to keep my photos safe"],
        "Keep two copies in different places: for example one on an external drive and one in a cloud "
        "storage service. Turn on automatic backup on your phone so new photos are copied too.",
    ),
]
FIRST = ["alex", "maria", "jon", "lena", "omar", "priya", "tom", "sofia", "ken", "ada", "luis", "nora"]
LAST = ["smith", "kim", "garcia", "fischer", "ito", "brown", "rossi", "novak", "ali", "jones"]
TOWNS = ["Millbrook", "Westfield", "Hollow Creek", "Stonebridge", "Fairview", "Lakeside", "Redhill", "Elmwood"]
PLANS = ["Starter", "Standard", "Plus", "Premium", "Pro", "Essential", "Advanced", "Unlimited"]
DEVICES = ["router", "modem", "Wi-Fi extender", "smart speaker", "printer", "mesh unit"]
MONTH_NAMES = [m for m, _ in MONTHS]


def _amount(rng: random.Random) -> str:
    return f"${rng.randint(10, 199)}.{rng.randint(0, 99):02d}"


def _date(rng: random.Random) -> str:
    month, days = rng.choice(MONTHS)
    return f"{month} {rng.randint(1, days)}"


def _order(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randint(10000, 999999)}"


def _email(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)}.{rng.choice(LAST)}@example.org"


# Account and home-internet questions, answered plainly by a neutral assistant that has no access to the
# account: it explains where to look and what usually happens. Each: (user phrasings, answers) with slots.
SERVICE: list[tuple[list[str], list[str]]] = [
    (
        [
            "What is the {amount} charge from {date} on my bill?",
            "I was charged {amount} on {date} and I don't know why.",
            "why is my bill {amount} this month",
        ],
        [
            "A charge of {amount} is usually the monthly price of your plan, sometimes with a one-off fee. The "
            "billing page of your account lists every line of the bill, so you can see exactly what it covers.",
            "To find out what the {amount} charge is:\n1. Sign in to your account.\n2. Open the billing section "
            "and select the charge.\n3. Check each line item and contact the provider if one looks wrong.",
        ],
    ),
    (
        [
            "How do I get a refund for order {order}?",
            "I want my money back for order {order}.",
            "order {order} is broken, can I return it?",
        ],
        [
            "Most shops refund an order such as {order} once the item is returned. Start a return from the "
            "orders page of your account, send the item back, and the money usually arrives within a week.",
            "To return order {order}:\n1. Open the orders page and choose Return.\n2. Pack the item with its "
            "cables.\n3. Send it back with the label you are given.",
        ],
    ),
    (
        [
            "I can't sign in, how do I reset my password for {email}?",
            "forgot the password for {email}",
            "How can I change my password? My login is {email}.",
        ],
        [
            "On the sign-in page, choose Forgot password and enter {email}. A reset link is sent to that "
            "address; open it and pick a new password. Check the spam folder if it does not arrive.",
            "To reset your password:\n1. Go to the sign-in page and choose Forgot password.\n2. Enter {email}.\n"
            "3. Open the link in the email and choose a new password.",
        ],
    ),
    (
        [
            "Where is my order {order}?",
            "When will order {order} arrive?",
            "has my package {order} been sent",
        ],
        [
            "You can follow order {order} on the orders page of your account or with the tracking link in the "
            "shipping email. Most deliveries arrive within 2 to 5 working days.",
            "Tracking shows where order {order} is. If it has not moved for several days, contact the shop with "
            "the order number so they can check with the carrier.",
        ],
    ),
    (
        [
            "How do I change from the {plan} plan to the {plan2} plan?",
            "I want to switch my plan to {plan2}.",
            "can I downgrade to {plan2}",
        ],
        [
            "Plan changes are usually made in the account settings under Plan. Choose {plan2}, confirm, and the "
            "new price normally starts from the next billing date.",
            "To switch to {plan2}:\n1. Sign in and open the plan settings.\n2. Select {plan2}.\n3. Confirm the "
            "change and note the date it starts.",
        ],
    ),
    (
        [
            "My internet is down in {town}. What should I do?",
            "no internet connection at home in {town} since this morning",
            "Is there an outage in {town}?",
        ],
        [
            "First check the provider's status page for outages in {town}. If there is none, restart the "
            "router by unplugging it for 30 seconds, and check that every cable is firmly connected.",
            "When the internet stops working:\n1. Look for an outage notice for {town}.\n2. Restart the router.\n"
            "3. If it still does not work, contact the provider with the lights you see on the router.",
        ],
    ),
    (
        [
            "How do I delete my account {email}?",
            "Please close my account, the email is {email}.",
            "I want all my data removed",
        ],
        [
            "Accounts can usually be closed from the privacy or account settings. Choose Delete account and "
            "confirm; a confirmation is sent by email, and personal data is removed after the legal waiting time.",
            "To close an account:\n1. Sign in and open the account settings.\n2. Choose Delete account.\n"
            "3. Confirm with the link sent by email.",
        ],
    ),
    (
        [
            "Where can I find my invoice for {month}?",
            "I need a copy of the {month} invoice.",
            "how do I download an old invoice",
        ],
        [
            "Invoices are kept in the billing section of your account. Select {month}, then choose Download to "
            "save it as a PDF.",
            "To get an invoice:\n1. Open the billing section of your account.\n2. Find {month} in the list.\n"
            "3. Download it or send it to your email.",
        ],
    ),
    (
        [
            "How do I set up a new {device}?",
            "I just got a {device}, how do I install it?",
            "help setting up my {device}",
        ],
        [
            "Connect the {device} to power and, if it needs one, to the network cable. Wait until the light is "
            "steady, then follow the setup steps in the manufacturer's app.",
            "To set up the {device}:\n1. Plug it in and wait for a steady light.\n2. Open the setup app.\n"
            "3. Follow the steps to join it to your network.",
        ],
    ),
    (
        [
            "My card payment failed, how do I update my payment method?",
            "How can I change the card I pay with?",
            "payment declined, what now",
        ],
        [
            "A payment usually fails when a card has expired or was replaced. Add the new card in the payment "
            "settings of your account, and the failed amount is normally collected again within a few days.",
            "To update a payment method:\n1. Open the payment settings.\n2. Add the new card.\n3. Make it the "
            "default and remove the old one.",
        ],
    ),
    (
        [
            "Why is my internet so slow?",
            "I pay for the {plan} plan but the speed is only {speed} Mbps.",
            "slow wifi in the evening, any tips",
        ],
        [
            "Speeds over Wi-Fi depend on distance and walls. Test the speed with a cable plugged into the "
            "router, restart the router, and move it to a central, open spot; if a cabled test is still slow, "
            "contact the provider.",
            "{speed} Mbps is low for most plans. Run a speed test with a cable, restart the router, and if the "
            "result stays low, ask the provider to check the line.",
        ],
    ),
    (
        [
            "I'm moving to {town} on {date}, how do I move my internet?",
            "How do I take my internet service to a new address?",
            "moving house to {town} next month",
        ],
        [
            "Tell your provider your new address and moving date, {date}, a few weeks ahead. They check what "
            "is available in {town} and book the connection so it is ready when you arrive.",
            "To move your service:\n1. Give the provider your new address in {town}.\n2. Choose the moving "
            "date.\n3. Take the router with you and set it up at the new home.",
        ],
    ),
]


def _fill(template: str, slots: dict[str, str]) -> str:
    return template.format(**slots)


def _service(rng: random.Random) -> tuple[str, str]:
    questions, answers = rng.choice(SERVICE)
    plan, plan2 = rng.sample(PLANS, 2)
    slots = {
        "amount": _amount(rng),
        "date": _date(rng),
        "order": _order(rng),
        "email": _email(rng),
        "plan": plan,
        "plan2": plan2,
        "town": rng.choice(TOWNS),
        "month": f"{rng.choice(MONTH_NAMES)} {rng.randint(2019, 2025)}",
        "device": rng.choice(DEVICES),
        "speed": str(rng.randint(3, 40)),
    }
    return _fill(rng.choice(questions), slots), _fill(rng.choice(answers), slots)


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    op = rng.choice(["plus", "minus", "times"])
    a, b = rng.randint(2, 99), rng.randint(2, 99 if op != "times" else 12)
    if op == "minus" and b > a:
        a, b = b, a
    result = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    question = rng.choice(
        [f"What is {a} {op} {b}?", f"what's {a} {op} {b}", f"Calculate {a} {NUMBER_WORDS[op]} {b}.", f"{a} {op} {b}?"]
    )
    return question, f"{a} {op} {b} is {result}."


def _conversion(rng: random.Random) -> tuple[str, str]:
    small, big, factor = rng.choice(CONVERSIONS)
    n = rng.randint(2, 12)
    question = rng.choice([f"How many {small} are in {n} {big}?", f"Convert {n} {big} to {small}."])
    return question, f"{n} {big} is {n * factor} {small}, because one of them is {factor} {small}."


def _capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(list(COUNTRIES))
    question = rng.choice(
        [f"What is the capital of {country}?", f"capital of {country}?", f"Which city is the capital of {country}?"]
    )
    return question, f"The capital of {country} is {COUNTRIES[country]}."


def _definition(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(list(DEFINITIONS))
    question = rng.choice([f"What does {word} mean?", f"Define {word}.", f"what is a {word}"])
    return question, f"A {word} is {DEFINITIONS[word]}."


def _opposite(rng: random.Random) -> tuple[str, str]:
    word, other = rng.choice(list(OPPOSITES.items()))
    if rng.random() < 0.5:
        word, other = other, word
    question = rng.choice(
        [f"What is the opposite of {word}?", f"opposite of {word}?", f"Give me an antonym for {word}."]
    )
    return question, f"The opposite of {word} is {other}."


def _calendar(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        i = rng.randrange(7)
        return rng.choice([f"What day comes after {DAYS[i]}?", f"Which day follows {DAYS[i]}?"]), (
            f"The day after {DAYS[i]} is {DAYS[(i + 1) % 7]}."
        )
    month, days = rng.choice(MONTHS)
    note = " (29 in a leap year)" if month == "February" else ""
    return rng.choice([f"How many days are in {month}?", f"how many days does {month} have"]), (
        f"{month} has {days} days{note}."
    )


def _sorting(rng: random.Random) -> tuple[str, str]:
    numbers = rng.sample(range(1, 100), rng.randint(3, 5))
    listed = ", ".join(map(str, numbers))
    if rng.random() < 0.5:
        return f"Sort these numbers from smallest to largest: {listed}", (
            "From smallest to largest: " + ", ".join(map(str, sorted(numbers))) + "."
        )
    return f"Which is the largest of {listed}?", f"The largest number is {max(numbers)}."


def _comparison(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(range(1, 1000), 2)
    question = rng.choice([f"Which is bigger, {a} or {b}?", f"Is {a} larger than {b}?"])
    if question.startswith("Is"):
        return question, f"{'Yes' if a > b else 'No'}, {max(a, b)} is larger than {min(a, b)}."
    return question, f"{max(a, b)} is bigger than {min(a, b)}."


def _howto(rng: random.Random) -> tuple[str, str]:
    questions, answer = rng.choice(HOWTOS)
    return rng.choice(questions), answer


# (generator, weight): account and home-internet help is the largest share, so the base speaks that topic
# fluently, but in its own neutral voice.
KINDS: list[tuple[Callable[[random.Random], tuple[str, str]], int]] = [
    (_service, 8),
    (_arithmetic, 2),
    (_conversion, 1),
    (_capital, 1),
    (_definition, 1),
    (_opposite, 1),
    (_calendar, 1),
    (_sorting, 1),
    (_comparison, 1),
    (_howto, 2),
]
FOLLOW_UPS = [
    ("Thanks, that helps.", "You're welcome. Ask again any time."),
    ("Can you say that more briefly?", None),
    ("thank you", "You're welcome."),
]


def _ask(rng: random.Random, question: str) -> str:
    opener = rng.choice(OPENERS)
    if opener and question[0].isupper() and not question.startswith(("I ", "I'")):
        question = question[0].lower() + question[1:]
    return f"{opener}{question}{rng.choice(CLOSERS)}"


def _one(rng: random.Random) -> dict:
    makers, weights = zip(*KINDS, strict=True)
    question, answer = rng.choices(makers, weights=weights)[0](rng)
    messages = []
    if rng.random() < SYSTEM_SHARE:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages += [{"role": "user", "content": _ask(rng, question)}, {"role": "assistant", "content": answer}]
    if rng.random() < MULTI_TURN_SHARE:
        follow, reply = rng.choice(FOLLOW_UPS)
        if reply is None:  # a shorter answer: its first sentence
            reply = answer.split("\n")[0].split(". ")[0].rstrip(".:") + "."
        messages += [{"role": "user", "content": follow}, {"role": "assistant", "content": reply}]
    return {"messages": messages}


def generate(count: int = COUNT, seed: int = SEED) -> list[dict]:
    """`count` conversations in OpenAI chat format, the same ones for the same arguments."""
    rng = random.Random(seed)
    return [_one(rng) for _ in range(count)]


def main(out_dir: str | Path | None = None) -> Path:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    path = out / "general.jsonl"
    path.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in generate()), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(f"wrote {main(sys.argv[1] if len(sys.argv) > 1 else None)}")
