"""Specifics in a reply (docs/answers.md): each kind found and normalised, grounded when the conversation gave the same
value in another form, invented when it never did; and what is not a specific (policy numbers, plan names)."""

from __future__ import annotations

import pytest

from finetune.data.specifics import find_specifics, invented, known_keys


def _found(text: str) -> list[tuple[str, str]]:
    return [(s.kind, text[s.start : s.end]) for s in find_specifics(text)]


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("I have started a refund for order BR-46304.", "identifier", "BR-46304"),
        ("Your ticket INC0012345 is open.", "identifier", "INC0012345"),
        ("I found order 123456 in our system.", "identifier", "123456"),
        ("Case #4821 is closed.", "identifier", "4821"),
        ("The $94.42 charge is your plan.", "amount", "$94.42"),
        ("We refunded 12.50 EUR.", "amount", "12.50 EUR"),
        ("It renews on July 28.", "date", "July 28"),
        ("It renews on 28 July 2024.", "date", "28 July 2024"),
        ("It renewed on 2024-07-28.", "date", "2024-07-28"),
        ("Your November 2023 invoice is attached.", "date", "November 2023"),
        ("Service is back by 6 pm today.", "time", "6 pm"),
        ("The engineer arrives at 18:30.", "time", "18:30"),
        ("Service returns by noon.", "time", "noon"),
        ("I charged the card ending in 4821.", "ending", "4821"),
        ("The card ****4821 was declined.", "ending", "4821"),
        ("Call us on +1 415 555 2671.", "phone", "+1 415 555 2671"),
        ("I wrote to jane.doe@example.com.", "email", "jane.doe@example.com"),
        ("See https://brightside.example/help/billing.", "url", "https://brightside.example/help/billing"),
        ("Tracking number 1Z999AA10123456784 is on its way.", "tracking", "1Z999AA10123456784"),
        ("Your parcel JD014600006281234567 left the depot.", "tracking", "JD014600006281234567"),
    ],
)
def test_each_kind_is_found(text, kind, value):
    assert (kind, value) in _found(text)


def test_policy_numbers_plan_names_and_prose_are_not_specifics():
    text = (
        "Hi there, thanks for reaching out! Refunds take 5 to 7 business days, links last 30 minutes, and the "
        "Home 200 plan moves to Gamer 800 within 24 hours. We answer 24/7 on Wi-Fi or 4K streams.\n\nWarm regards"
    )
    assert _found(text) == []


@pytest.mark.parametrize(
    ("given", "reply"),
    [
        (
            "Got billed 94.42 on 28 July.",
            "The $94.42 charge from July 28 is your plan.",
        ),  # amount and date, other forms
        ("Refund order br46304 please.", "I refunded order BR-46304."),  # case and separator of an id
        ("My card 4111111111114821 failed.", "The card ending in 4821 failed."),  # the last four of a long number
        ("The visit is at 18:00.", "The engineer comes at 6 pm."),  # 24-hour and 12-hour clock
        ("I moved on 05/06/2024.", "Your move on 6 May is booked."),  # a numeric date read day first
        ("My email is Jane.Doe@Example.com", "I wrote to jane.doe@example.com."),
    ],
)
def test_a_value_the_conversation_gave_is_grounded_whatever_its_form(given, reply):
    assert invented(reply, known_keys([given])) == []


def test_a_value_the_conversation_never_gave_is_invented_once_per_value():
    known = known_keys(["Got billed $94.42 on July 28, which seems wrong. What is it?"])
    reply = "I have started a refund for order BR-46304 (BR-46304) on your card ending in 1234 by 6 pm on July 28."
    assert [s.kind for s in invented(reply, known)] == ["identifier", "ending", "time"]


def test_a_nearby_number_does_not_ground_another():
    known = known_keys(["Refund order BR-46304 for $94.42 please."])
    assert [s.kind for s in invented("Refunded order BR-46305 for $94.24.", known)] == ["identifier", "amount"]
