"""Generate the bundled example dataset: Brightside Support, a fictional home-internet support team.

Every assistant reply follows one house style: a fixed greeting line, a short answer (one to three
sentences or two to three numbered steps) and a fixed sign-off. The data is built from templates with
a seeded random generator, so running this script again writes byte-identical files.

    python examples/generate.py            # writes next to this file (the data through its links into the package)
    python examples/generate.py OUT_DIR    # writes into OUT_DIR

Files written: train.jsonl, test.jsonl (held out: slot values and some phrasings never seen in train),
house_style.json (the greeting and sign-off, for substring checks) and README.md.
"""

from __future__ import annotations

import json
import random
import string
import sys
from pathlib import Path

GREETING = "Hi there, thanks for reaching out to Brightside Support!"
SIGN_OFF = "Warm regards,\nSam from Brightside Support"

SEED = 1234
N_TRAIN = 360
N_TEST_PER_TOPIC = 5
SYSTEM_SHARE = 0.20
MULTI_TURN_SHARE = 0.25
WEIGHTED_SHARE = 0.04
MIN_WORDS, MAX_WORDS = 25, 70

SYSTEM_PROMPTS = [
    "You are Brightside's support assistant.",
    "You are a helpful support agent for Brightside, a home internet provider.",
    "Answer customer questions for Brightside Support.",
]

PREFIXES = ["", "", "", "Hi, ", "Hello, ", "hey ", "Hi team, "]
SUFFIXES = ["", "", "", " Thanks!", " thanks", " Cheers.", " Thank you."]

# Each topic: user phrasings seen in train ("user"), phrasings kept for the test file only ("held_out"),
# answer bodies, and follow-up (user, answer) pairs for multi-turn conversations. Slots in braces are
# filled from the pools below; a slot used by the answers but not the user message (like {time}) is free.
TOPICS: list[dict] = [
    {
        "name": "billing",
        "user": [
            "Why was I charged {amount} on {date}? That's more than usual.",
            "hey, my card got hit for {amount} on {date} and I don't know what it's for",
            "I see a charge of {amount} from {date} on my statement, can you explain it?",
            "There's a {amount} charge dated {date} that I don't recognise.",
        ],
        "held_out": [
            "Got billed {amount} on {date}, which seems wrong. What is it?",
            "Can you tell me what the {amount} payment taken on {date} was for?",
        ],
        "answers": [
            "The {amount} charge on {date} is your monthly plan plus a one-time prorated fee from your last "
            "plan change. You can see the full breakdown under Account > Billing in the app.",
            "I checked the {amount} charge from {date}. It covers your monthly fee and a partial month from when "
            "your service started. Your next bill returns to the usual amount.",
            "Here is how to check the {amount} charge from {date}:\n1. Open the app and go to Account > Billing.\n"
            "2. Tap the charge to see each line item.\n3. Reply here if anything still looks wrong.",
        ],
        "followups": [
            (
                "Will it happen again next month?",
                "No, the extra part of that charge was one-time only. From next month you pay your usual plan "
                "price on the same date.",
            ),
            (
                "Can I get a copy of the breakdown?",
                "Yes. Go to Account > Billing > Statements in the app and tap Download. The PDF lists every line "
                "item for that month.",
            ),
        ],
    },
    {
        "name": "refunds",
        "user": [
            "Can I get a refund for order {order}? It stopped working after two days.",
            "I'd like a refund for order {order} please.",
            "how do i get my money back for order {order}",
            "Order {order} arrived damaged and I want a refund.",
        ],
        "held_out": [
            "I want to return {order} and get refunded, how does that work?",
            "Please refund my order {order}, it's not what I expected.",
        ],
        "answers": [
            "I have started a refund for order {order}. It goes back to your original payment method and "
            "usually appears within 5 to 7 business days.",
            "To get your refund for order {order}:\n1. Pack the item in its original box.\n2. Print the free "
            "return label from Account > Orders.\n3. Drop it at any post office.",
        ],
        "followups": [
            (
                "Do I need to send back the cables too?",
                "Yes, please include the power cable and the network cable. A missing cable can delay your "
                "refund by a few days.",
            ),
            (
                "Will I get an email when it's done?",
                "Yes, we email you as soon as the refund for order {order} is sent. You can also track it under "
                "Account > Orders.",
            ),
        ],
    },
    {
        "name": "password_reset",
        "user": [
            "I forgot my password and can't log in. My email is {email}.",
            "locked out of my account ({email}), need to reset my password",
            "How do I reset the password for {email}?",
            "The password reset email never arrived at {email}.",
        ],
        "held_out": [
            "Can't remember my login password, account is {email}. Help?",
            "Need a new password for my account {email} please",
        ],
        "answers": [
            "I have sent a new password reset link to {email}. It is valid for 30 minutes, so please check your "
            "spam folder if you do not see it soon.",
            "To reset the password for {email}:\n1. Open the app and tap Forgot password.\n2. Enter {email} and "
            "tap Send.\n3. Follow the link in the email within 30 minutes.",
        ],
        "followups": [
            (
                "The link says it expired.",
                "Reset links only last 30 minutes. Tap Forgot password again to get a fresh link, and open it on "
                "the same device if you can.",
            ),
            (
                "Do I need to log in again on my other devices?",
                "Yes, a new password signs you out everywhere for security. Just log in again with the new "
                "password on each device.",
            ),
        ],
    },
    {
        "name": "shipping",
        "user": [
            "Where is my order {order}? It hasn't arrived yet.",
            "any update on shipping for order {order}?",
            "When will order {order} be delivered?",
            "Tracking for {order} hasn't changed in days, is it lost?",
        ],
        "held_out": [
            "My package for order {order} still isn't here. What's going on?",
            "Has order {order} shipped yet?",
        ],
        "answers": [
            "Order {order} left our warehouse and is with the courier now. Most deliveries arrive within 3 to 5 "
            "business days, and you can follow it under Account > Orders.",
            "I checked order {order} and it is out for delivery today. If it has not arrived in 2 business days, "
            "reply here and we will send a replacement.",
        ],
        "followups": [
            (
                "Can I change the delivery address?",
                "Yes, as long as it has not been delivered. Go to Account > Orders, open order {order} and tap "
                "Change address.",
            ),
            (
                "What if I'm not home?",
                "The courier will leave a card and try again the next day. After three tries the parcel goes to "
                "your local pickup point.",
            ),
        ],
    },
    {
        "name": "plan_change",
        "user": [
            "I'd like to switch from {plan} to {new_plan}.",
            "can I upgrade my {plan} plan to {new_plan}?",
            "How do I move from the {plan} plan to {new_plan}?",
            "Thinking about changing {plan} to {new_plan}, what do I need to do?",
        ],
        "held_out": [
            "Please change my plan, {plan} to {new_plan}.",
            "Is it possible to go from {plan} over to {new_plan} this month?",
        ],
        "answers": [
            "I can move you from {plan} to {new_plan}. The change starts on your next billing date, and your "
            "first bill is prorated so you only pay for what you use.",
            "To switch from {plan} to {new_plan}:\n1. Open the app and go to Account > Plan.\n2. Pick {new_plan} "
            "and tap Confirm.\nThe new plan is active within an hour.",
        ],
        "followups": [
            (
                "Is there a fee for switching?",
                "No, plan changes are free. You only pay the {new_plan} monthly price from your next billing date.",
            ),
            (
                "Can I switch back later?",
                "Yes, you can change plans once every 30 days at no cost under Account > Plan in the app.",
            ),
        ],
    },
    {
        "name": "outage",
        "user": [
            "Is there an outage in {town}? My internet is down.",
            "internet's been out all morning in {town}, what's going on",
            "No connection at all here in {town}. Is something wrong on your end?",
            "Are you having problems in {town}? Nothing loads.",
        ],
        "held_out": [
            "My whole street in {town} lost internet. Known issue?",
            "Service down in {town} again?",
        ],
        "answers": [
            "Yes, there is a known outage in {town} and our engineers are on site. We expect service to be back "
            "by {time} today.",
            "We are seeing an outage in {town} caused by a damaged cable. Service should return by {time}, and "
            "we will text you when it is fixed.",
            "There is no known outage in {town} right now, so please try this:\n1. Unplug your router for 30 "
            "seconds.\n2. Plug it back in and wait for a green light.\n3. If it stays red, reply here.",
        ],
        "followups": [
            (
                "Will I get money back for the downtime?",
                "Yes, outages longer than 4 hours get an automatic credit on your next bill. You do not need to "
                "do anything.",
            ),
            (
                "How will I know when it's fixed?",
                "We will send a text to the number on your account as soon as service in {town} is back.",
            ),
        ],
    },
    {
        "name": "account_deletion",
        "user": [
            "Please delete my account, {email}.",
            "how do I close my Brightside account? it's {email}",
            "I want to cancel everything and delete my account ({email}).",
            "Can you remove all my data? Account email is {email}.",
        ],
        "held_out": [
            "I'm leaving Brightside, please shut down the account under {email}.",
            "Delete account {email} and all the data you have on me.",
        ],
        "answers": [
            "I have started closing the account for {email}. You will get a confirmation email, and all your "
            "data is deleted within 30 days.",
            "To delete the account for {email}:\n1. Return any rented equipment.\n2. Go to Account > Privacy and "
            "tap Delete account.\n3. Confirm from the email we send you.",
        ],
        "followups": [
            (
                "Can I change my mind later?",
                "Yes, you have 14 days to cancel the deletion. Just log in again and tap Keep my account.",
            ),
            (
                "Do I need to return the router?",
                "Yes, please return it within 30 days using the free label in your confirmation email to avoid a fee.",
            ),
        ],
    },
    {
        "name": "invoices",
        "user": [
            "Can you send me the invoice for {month}?",
            "I need a copy of my {month} invoice for my taxes.",
            "where can i download invoices? looking for {month}",
            "My company needs the {month} invoice with my business address on it.",
        ],
        "held_out": [
            "Could I get the bill for {month} as a PDF?",
            "Lost my {month} invoice, can you resend it?",
        ],
        "answers": [
            "I have emailed your {month} invoice to the address on your account. You can also download any "
            "invoice as a PDF under Account > Billing > Invoices.",
            "To get your {month} invoice:\n1. Open Account > Billing > Invoices.\n2. Find {month} and tap "
            "Download PDF.\nYou can add a business address under Account > Details first.",
        ],
        "followups": [
            (
                "Can I get them emailed every month?",
                "Yes. Turn on Email my invoices under Account > Billing and each invoice will arrive on your "
                "billing date.",
            ),
            (
                "Can you add my company VAT number?",
                "Yes, add it under Account > Details and every new invoice will show it. Older invoices can be "
                "reissued from the same page.",
            ),
        ],
    },
    {
        "name": "router_setup",
        "user": [
            "I just got the {device}, how do I set it up?",
            "setting up my new {device} router, where do I start?",
            "The {device} arrived today. What are the setup steps?",
            "How do I connect my {device} to the internet?",
        ],
        "held_out": [
            "Need help installing my {device}, please.",
            "What's the easiest way to get the {device} working?",
        ],
        "answers": [
            "Setting up the {device} takes about 10 minutes:\n1. Plug it into the wall socket with the grey "
            "cable.\n2. Wait for the light to turn green.\n3. Join the Wi-Fi name printed on the back.",
            "To set up your {device}:\n1. Connect it to the fibre box and to power.\n2. Open the app and tap Add "
            "device.\n3. Follow the steps until the light is green.",
            "The {device} sets itself up once it is plugged in. Connect it to the wall socket, wait about 5 "
            "minutes for a green light, then join the Wi-Fi name on the sticker.",
        ],
        "followups": [
            (
                "How do I change the Wi-Fi password?",
                "Open the app, go to Devices > {device} > Wi-Fi and tap Change password. Your devices will then "
                "need the new password.",
            ),
            (
                "The light is blinking orange.",
                "Orange means it is still updating. Leave it plugged in for 10 minutes, and if it does not turn "
                "green, restart it once.",
            ),
        ],
    },
    {
        "name": "payment_method",
        "user": [
            "I got a new card, how do I update my payment details? Old one ended in {last4}.",
            "My card ending {last4} expired, please switch my payment method.",
            "payment failed on card ending {last4}, what should I do?",
            "How do I replace the card ending in {last4} on my account?",
        ],
        "held_out": [
            "Want to stop using the card ending {last4} and pay with a different one.",
            "Need to change the card on file, the current one ends in {last4}.",
        ],
        "answers": [
            "To replace the card ending in {last4}:\n1. Go to Account > Billing > Payment method.\n2. Tap Add "
            "card and enter the new details.\n3. Set it as default and remove the old one.",
            "You can swap the card ending in {last4} under Account > Billing > Payment method. Any failed "
            "payment is retried on the new card within 24 hours, so your service stays on.",
        ],
        "followups": [
            (
                "Can I pay by bank transfer instead?",
                "Yes, choose Direct debit under Account > Billing > Payment method and enter your bank details.",
            ),
            (
                "Will my service be cut off?",
                "No, you have 14 days to update your payment before anything changes, and your internet stays "
                "on meanwhile.",
            ),
        ],
    },
    {
        "name": "slow_speed",
        "user": [
            "I'm paying for {plan} but only getting {speed} Mbps.",
            "internet is really slow tonight, speed test says {speed} Mbps on my {plan} plan",
            "Why is my speed only {speed} Mbps? I'm on {plan}.",
            "Speeds have dropped to {speed} Mbps on {plan}, any idea why?",
        ],
        "held_out": [
            "Only {speed} Mbps on a {plan} plan, that's not right, is it?",
            "My {plan} connection crawls at {speed} Mbps. Can you check?",
        ],
        "answers": [
            "Sorry your {plan} line is running at {speed} Mbps. Please try this:\n1. Restart your router.\n2. "
            "Run the speed test again on a cable, not Wi-Fi.\n3. Send us the result if it is still low.",
            "{speed} Mbps is below what {plan} should give you. I have run a line check and reset your "
            "connection from our side, so please test again in 10 minutes.",
        ],
        "followups": [
            (
                "Still slow after the restart.",
                "Thanks for trying that. I have booked an engineer check for your line, and you will get a text "
                "with a time slot within 24 hours.",
            ),
            (
                "Could my Wi-Fi be the problem?",
                "It could be. Thick walls and distance slow Wi-Fi down, so try moving the router to a central, "
                "open spot or adding a Mesh Point.",
            ),
        ],
    },
    {
        "name": "moving_home",
        "user": [
            "I'm moving to {town} on {date}. Can I take my internet with me?",
            "moving house on {date}, new place is in {town}, what do I do about my service?",
            "How do I transfer my Brightside service to {town}? Move date is {date}.",
            "We move to {town} on {date}, can you set up internet there?",
        ],
        "held_out": [
            "Relocating to {town} around {date}. How does moving my plan work?",
            "New address in {town} from {date}, please move my connection.",
        ],
        "answers": [
            "Good luck with the move to {town}! I have booked your service transfer for {date}, and your router "
            "will work at the new address the same day.",
            "To move your service to {town}:\n1. Go to Account > Moving home.\n2. Enter your new address and "
            "{date} as the move date.\n3. Bring your router and plug it in on the day.",
        ],
        "followups": [
            (
                "Is there a moving fee?",
                "No, moving your service is free as long as you stay on your current plan for at least 6 more months.",
            ),
            (
                "What if the move date changes?",
                "No problem. Update the date under Account > Moving home up to 2 days before {date}.",
            ),
        ],
    },
]

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
FIRST_NAMES = [
    "alex", "jamie", "priya", "tom", "maria", "chen", "olu", "sara", "liam", "noor",
    "eva", "raj", "kim", "lucas", "amara", "ben", "ines", "yusuf", "hana", "leo",
]  # fmt: skip
LAST_NAMES = ["morgan", "patel", "okafor", "silva", "nguyen", "berg", "kowalski", "haddad", "reyes", "larsen"]
TOWNS = [
    "Riverton", "Maple Hill", "Oakridge", "Lakeside", "Cedar Falls", "Pine Grove", "Stonebridge", "Willow Creek",
    "Ashford", "Brookvale", "Millbrook", "Redcliff", "Harbor Point", "Elmwood", "Fox Hollow", "Silver Bay",
]  # fmt: skip
PLANS = ["Lite 50", "Home 200", "Home 500", "Gig 1000", "Family 300", "Gamer 800", "Basic 100", "Max 2000"]
DEVICES = ["Hub 2", "Hub 3", "Hub Mini", "Hub Pro", "Mesh Point", "Hub 3 Plus", "Hub Air", "Hub Max"]
TIMES = ["noon", "1 pm", "2 pm", "3 pm", "4 pm", "5 pm", "6 pm", "7 pm", "8 pm", "9 pm", "10 pm", "11 am"]


def _slot_pools(rng: random.Random) -> dict[str, list[str]]:
    """Every slot's full list of values (before the train/test split)."""
    return {
        "amount": [f"${n // 100}.{n % 100:02d}" for n in rng.sample(range(1200, 16000), 120)],
        "date": [f"{m} {d}" for m in MONTHS for d in range(1, 29)],
        "order": [f"BR-{n}" for n in rng.sample(range(100000, 1000000), 400)],
        "email": [f"{f}.{last}@example.com" for f in FIRST_NAMES for last in LAST_NAMES],
        "plan": list(PLANS),
        "town": list(TOWNS),
        "month": [f"{m} {y}" for y in (2023, 2024, 2025) for m in MONTHS],
        "device": list(DEVICES),
        "last4": [f"{n}" for n in rng.sample(range(1000, 10000), 200)],
        "speed": [str(n) for n in range(3, 95)],
        "time": list(TIMES),
    }


def _split_pools(rng: random.Random) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Shuffle each pool and split it into disjoint train (3/4) and test (1/4) values."""
    train, test = {}, {}
    for name, values in _slot_pools(rng).items():
        values = list(values)
        rng.shuffle(values)
        cut = max(3, len(values) // 4)  # at least 3, so {plan} -> {new_plan} has some variety in test
        test[name], train[name] = values[:cut], values[cut:]
    return train, test


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _fill_slots(rng: random.Random, pool: dict[str, list[str]]) -> dict[str, str]:
    values = {name: rng.choice(options) for name, options in pool.items() if name != "plan"}
    values["plan"], values["new_plan"] = rng.sample(pool["plan"], 2)
    return values


def reply(body: str) -> str:
    """One assistant reply in the house style."""
    return f"{GREETING}\n\n{body}\n\n{SIGN_OFF}"


def _user_message(rng: random.Random, template: str, slots: dict[str, str]) -> str:
    text = template.format(**slots)
    prefix = rng.choice(PREFIXES)
    if prefix and text[0].isupper():  # "Hi, can you ..." (but keep "Hi, I ...")
        text = text if text.split()[0].split("'")[0] == "I" else text[0].lower() + text[1:]
        text = prefix + text
    suffix = rng.choice(SUFFIXES)
    if suffix[1:2].isupper() and text[-1] not in ".?!)":
        text += "."
    return text + suffix


def _conversation(
    rng: random.Random,
    topic: dict,
    pool: dict[str, list[str]],
    templates: list[str],
    system: bool,
    multi_turn: bool,
    weighted: bool,
) -> dict:
    slots = _fill_slots(rng, pool)
    messages = []
    if system:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": _user_message(rng, rng.choice(templates), slots)})
    messages.append({"role": "assistant", "content": reply(rng.choice(topic["answers"]).format(**slots))})
    if multi_turn:
        question, answer = rng.choice(topic["followups"])
        if weighted:
            messages[-1]["weight"] = 0
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": reply(answer.format(**slots))})
    return {"messages": messages}


def _key(conversation: dict) -> str:
    return json.dumps(conversation, ensure_ascii=False, sort_keys=True)


def _check_templates() -> None:
    for topic in TOPICS:
        user_fields = [_fields(t) for t in topic["user"] + topic["held_out"]]
        assert all(f == user_fields[0] for f in user_fields), f"{topic['name']}: user templates use different slots"
    train_templates = {t for topic in TOPICS for t in topic["user"]}
    assert not train_templates & {t for topic in TOPICS for t in topic["held_out"]}, "a held-out phrasing is in train"


def build() -> tuple[list[dict], list[dict]]:
    """The (train, test) conversations; deterministic."""
    _check_templates()
    rng = random.Random(SEED)
    train_pool, test_pool = _split_pools(rng)

    topics = [TOPICS[i % len(TOPICS)] for i in range(N_TRAIN)]
    rng.shuffle(topics)
    n_multi = round(N_TRAIN * MULTI_TURN_SHARE)
    multi = set(rng.sample(range(N_TRAIN), n_multi))
    system = set(rng.sample(range(N_TRAIN), round(N_TRAIN * SYSTEM_SHARE)))
    weighted = set(rng.sample(sorted(multi), round(N_TRAIN * WEIGHTED_SHARE)))

    train: list[dict] = []
    seen: set[str] = set()
    for i, topic in enumerate(topics):
        while True:
            conversation = _conversation(rng, topic, train_pool, topic["user"], i in system, i in multi, i in weighted)
            if _key(conversation) not in seen:
                break
        seen.add(_key(conversation))
        train.append(conversation)

    train_users = {m["content"] for c in train for m in c["messages"] if m["role"] == "user"}
    test: list[dict] = []
    for topic in TOPICS:
        for j in range(N_TEST_PER_TOPIC):
            # The held-out phrasings first, then a mix; slot values always come from the test side of the split.
            templates = [topic["held_out"][j]] if j < len(topic["held_out"]) else topic["user"] + topic["held_out"]
            while True:
                conversation = _conversation(
                    rng, topic, test_pool, templates, rng.random() < SYSTEM_SHARE, False, False
                )
                if _key(conversation) not in seen and conversation["messages"][-2]["content"] not in train_users:
                    break
            seen.add(_key(conversation))
            test.append(conversation)

    _check(train, test)
    return train, test


def _check(train: list[dict], test: list[dict]) -> None:
    keys = [_key(c) for c in train]
    assert len(set(keys)) == len(keys), "duplicate conversation in train"
    assert not {_key(c) for c in test} & set(keys), "a test conversation also appears in train"
    for conversation in train + test:
        for message in conversation["messages"]:
            if message["role"] != "assistant":
                assert "weight" not in message
                continue
            text = message["content"]
            assert text.startswith(GREETING) and text.endswith(SIGN_OFF), text
            assert MIN_WORDS <= len(text.split()) <= MAX_WORDS, (len(text.split()), text)
    for conversation in test:
        assert [m["role"] for m in conversation["messages"] if m["role"] != "system"] == ["user", "assistant"]
        assert all("weight" not in m for m in conversation["messages"])


def _jsonl(conversations: list[dict]) -> str:
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in conversations)


def stats(conversations: list[dict]) -> dict[str, float]:
    replies = [m["content"] for c in conversations for m in c["messages"] if m["role"] == "assistant"]
    return {
        "conversations": len(conversations),
        "multi_turn": sum(1 for c in conversations if sum(m["role"] == "user" for m in c["messages"]) > 1),
        "system": sum(1 for c in conversations if c["messages"][0]["role"] == "system"),
        "weighted": sum(1 for c in conversations if any("weight" in m for m in c["messages"])),
        "assistant_replies": len(replies),
        "avg_words": round(sum(len(r.split()) for r in replies) / len(replies), 1),
        "avg_chars": round(sum(len(r) for r in replies) / len(replies), 1),
    }


def _readme(train: list[dict], test: list[dict]) -> str:
    tr, te = stats(train), stats(test)
    topics = ", ".join(t["name"].replace("_", " ") for t in TOPICS)
    sign_off = SIGN_OFF.replace("\n", "\n> ")
    return f"""# Example dataset: Brightside Support

Chat conversations of **Brightside Support**, the support team of a fictional home-internet provider, in
OpenAI chat format (`{{"messages": [{{"role": ..., "content": ...}}]}}`, one conversation a line). It is the
data `finetune demo` trains on: the team answers in a recognisable house style, so it is easy to see whether
a fine-tuned model has picked it up.

This folder is written by `generate.py` (standard library only, seeded, so running it again gives
byte-identical files): `python examples/generate.py [OUT_DIR]`. Do not edit the data files by hand.

`train.jsonl`, `test.jsonl` and `house_style.json` here (and `generate_general.py`, the toy base's pretraining
corpus) are links to the package's own copies in `finetune/ship/demo_data/`: `finetune demo` reads them there, so it
runs from an installed wheel in any folder; the commands in the docs read them here, from a checkout.

## House style

Every assistant reply is a fixed greeting line, a short answer (one to three sentences or two to three
numbered steps), and a fixed sign-off:

> {GREETING}
>
> *(the answer)*
>
> {sign_off}

The greeting and sign-off are also in `house_style.json`, for plain substring checks.

## Files

| file | conversations | multi-turn | with system prompt | with `weight: 0` | assistant replies | avg words / chars per reply |
|---|---|---|---|---|---|---|
| `train.jsonl` | {tr["conversations"]} | {tr["multi_turn"]} | {tr["system"]} | {tr["weighted"]} | {tr["assistant_replies"]} | {tr["avg_words"]} / {tr["avg_chars"]} |
| `test.jsonl` | {te["conversations"]} | {te["multi_turn"]} | {te["system"]} | {te["weighted"]} | {te["assistant_replies"]} | {te["avg_words"]} / {te["avg_chars"]} |

Topics ({len(TOPICS)}): {topics}.

Multi-turn conversations have two user/assistant exchanges, both replies in the house style; in a few of
them the first reply has `"weight": 0` (context only, not trained on).

`test.jsonl` is held out: single-turn, no weights, the same topics, but every slot value (order numbers,
e-mail addresses, towns, plans, dates, ...) comes from a set never used in train, some user phrasings appear
only there, and no test user message occurs in train. Its assistant replies are the reference answers.
"""


def main(out_dir: str | Path | None = None) -> dict[str, Path]:
    """Write the dataset into out_dir (default: the folder of this file); return the written paths."""
    out = Path(out_dir) if out_dir is not None else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    train, test = build()
    contents = {
        "train.jsonl": _jsonl(train),
        "test.jsonl": _jsonl(test),
        "house_style.json": json.dumps({"greeting": GREETING, "sign_off": SIGN_OFF}, ensure_ascii=False, indent=2)
        + "\n",
        "README.md": _readme(train, test),
    }
    paths = {}
    for name, text in contents.items():
        paths[name] = out / name
        paths[name].write_bytes(text.encode("utf-8"))
    return paths


if __name__ == "__main__":
    written = main(sys.argv[1] if len(sys.argv) > 1 else None)
    for path in written.values():
        print(path)
