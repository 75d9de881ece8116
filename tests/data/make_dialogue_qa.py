"""Write ``tests/data/dialogue_qa.jsonl``: project-written two-person chats with QA pairs.

    python tests/data/make_dialogue_qa.py           # rewrite the file
    python tests/data/make_dialogue_qa.py --check   # exit 1 if the file differs from the output

Every word comes from the templates and word lists below (MIT, like the project); no text
is taken from any data set. Each conversation is two friends chatting over several dated
sittings: the first sitting's date line is a system message, later ones are prefixed to the
sitting's first message, and every chat message has a ``msg_id`` ``D<sitting>:<n>``. Facts
are stated once, among small talk, and asked about in ``qa`` records
``{"question", "answer", "evidence": [msg ids], "category"}``: ``single-hop`` (one message),
``multi-hop`` (two messages of different sittings), ``temporal`` (the answer is the date
line of the sitting where it happened) and ``adversarial`` (never said: the gold answer is
"Not mentioned in the conversation"). Answer values are drawn from word lists shared by
all conversations, so another conversation's answers sometimes occur in a chat by chance,
as they would in real chats (the control of the quality tests depends on that).

The output is a pure function of ``SEED``: the same bytes on every run and machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

SEED = 20240915
OUT = Path(__file__).with_name("dialogue_qa.jsonl")
PAIRS = (("Noor", "Tomas"), ("Priya", "Jonas"), ("Maren", "Kofi"), ("Ilse", "Rafael"))
SITTINGS = 9
NOT_MENTIONED = "Not mentioned in the conversation"

# Answer values, shared by all conversations. Tuples fill several slots at once.
POOLS: dict[str, list[str] | list[tuple[str, ...]]] = {
    "city": [
        "Lisbon",
        "Tallinn",
        "Porto",
        "Ghent",
        "Bergen",
        "Cork",
        "Valencia",
        "Krakow",
        "Lyon",
        "Turku",
        "Trieste",
        "Aarhus",
        "Ljubljana",
        "Bilbao",
        "Utrecht",
        "Salzburg",
        "Gdansk",
        "Nantes",
    ],
    "wedding_city": [
        "Dubrovnik",
        "Seville",
        "Bruges",
        "Galway",
        "Verona",
        "Innsbruck",
        "Riga",
        "Bordeaux",
        "Edinburgh",
        "Granada",
        "Heidelberg",
        "Lucerne",
        "Malaga",
        "Tromso",
        "Vilnius",
    ],
    "sibling": [
        "Lena",
        "Osman",
        "Hedda",
        "Caspar",
        "Yusuf",
        "Greta",
        "Anselm",
        "Ines",
        "Milo",
        "Dagny",
        "Bertil",
        "Zofia",
        "Ruben",
        "Aurelie",
        "Stellan",
        "Imogen",
    ],
    "cousin": [
        "Petra",
        "Leopold",
        "Saoirse",
        "Matteo",
        "Henrike",
        "Dmitri",
        "Orla",
        "Benedikt",
        "Tamsin",
        "Joaquin",
        "Elodie",
        "Ragnar",
        "Viveka",
        "Ambrose",
    ],
    "pet": [
        "Biscuit",
        "Pepper",
        "Quince",
        "Marlowe",
        "Tofu",
        "Saffron",
        "Bramble",
        "Otis",
        "Clementine",
        "Nutmeg",
        "Wasabi",
        "Pickles",
        "Mochi",
        "Rhubarb",
        "Gizmo",
        "Pretzel",
    ],
    "species": [
        "beagle",
        "tabby cat",
        "rescue greyhound",
        "parrot",
        "border collie",
        "rabbit",
        "dachshund",
        "ginger kitten",
        "tortoise",
        "cockatiel",
    ],
    "instrument": [
        "cello",
        "banjo",
        "clarinet",
        "ukulele",
        "double bass",
        "accordion",
        "harp",
        "trombone",
        "mandolin",
        "oboe",
        "saxophone",
        "bagpipes",
    ],
    "teacher": [
        "Bartholomew",
        "Ottilie",
        "Casimir",
        "Wilhelmina",
        "Evander",
        "Rosalind",
        "Thaddeus",
        "Philippa",
    ],
    "title,author": [
        ("The Salt Orchard", "Miriam Achebe"),
        ("Winter Ledger", "Tobias Renn"),
        ("A Map of Small Rivers", "Clara Osei"),
        ("The Glass Harbour", "Ivo Lindqvist"),
        ("Nine Quiet Bridges", "Farah Demir"),
        ("The Lantern Keeper", "Hugo Vasquez"),
        ("Copper Tide", "Annika Solberg"),
        ("The Last Tram Home", "Desmond Okafor"),
        ("Paper Kites", "Lucia Ferrante"),
        ("The Orchard Wall", "Kenji Moriyama"),
    ],
    "company": [
        "Brightwell Labs",
        "Northmoor Transit",
        "Fennick Foods",
        "Calder Robotics",
        "Oakline Press",
        "Harrowgate Energy",
        "Quillfeather Games",
        "Marrow and Finch",
        "Ostrander Optics",
        "Tidewater Bank",
    ],
    "role": [
        "data analyst",
        "head chef",
        "site engineer",
        "copy editor",
        "logistics planner",
        "sound technician",
        "museum curator",
        "payroll officer",
        "ward nurse",
        "tram driver",
    ],
    "dish,secret": [
        ("lentil soup", "smoked paprika"),
        ("apple cake", "cardamom"),
        ("fish stew", "fennel seeds"),
        ("dumplings", "black vinegar"),
        ("tomato sauce", "a pinch of cinnamon"),
        ("potato salad", "pickled capers"),
        ("rye bread", "caraway"),
        ("chicken pie", "tarragon"),
        ("rice pudding", "orange zest"),
        ("goulash", "sweet marjoram"),
    ],
    "month": ["March", "May", "July", "September", "November", "October", "June", "April"],
    "place": [
        "the Azores",
        "Hokkaido",
        "Patagonia",
        "the Faroe Islands",
        "Sicily",
        "Oaxaca",
        "Tasmania",
        "the Dolomites",
        "Zanzibar",
        "Lapland",
        "Crete",
        "Madeira",
    ],
    "street": [
        "Willow Lane",
        "Harbour Street",
        "Juniper Row",
        "Mill Road",
        "Castle Terrace",
        "Tanners Yard",
        "Orchard Close",
        "Chapel Hill",
        "Weavers Court",
        "Linden Avenue",
        "Ropewalk Mews",
    ],
    "number": [str(n) for n in range(104, 399, 7)],
    "allergen": [
        "walnuts",
        "shellfish",
        "kiwi",
        "sesame",
        "birch pollen",
        "mustard",
        "cashews",
        "latex",
        "penicillin",
        "strawberries",
    ],
    "plant": [
        "lemon tree",
        "jasmine",
        "chilli plant",
        "wisteria",
        "orchid",
        "bougainvillea",
        "camellia",
        "passion flower",
        "geranium",
        "hibiscus",
    ],
    "race": [
        "Riverside half marathon",
        "harbour 10k",
        "Hill Valley trail race",
        "city night run",
        "Lakeshore half marathon",
        "coastal fell race",
    ],
    "position": [str(n) for n in range(431, 990, 13)],
    "colour": ["silver", "cherry red", "bottle green", "ivory", "turquoise", "charcoal grey", "bronze"],
    "car": ["Volvo estate", "Fiat Panda", "camper van", "Skoda hatchback", "Renault Clio", "pickup truck"],
    "play_role": [
        "the lighthouse keeper",
        "the wicked queen",
        "a talking fox",
        "the narrator",
        "the pirate captain",
        "the snow goose",
        "the grumpy troll",
        "the royal jester",
    ],
    "gift": [
        "a brass compass",
        "a sextant",
        "a fountain pen",
        "a vintage radio",
        "a silk scarf",
        "a telescope",
        "a wicker hamper",
        "an espresso machine",
    ],
    "paint": ["sage", "terracotta", "pale lavender", "ochre", "duck egg", "peach", "plum", "teal"],
    "skill": [
        "pottery",
        "bouldering",
        "sourdough baking",
        "watercolour",
        "salsa dancing",
        "woodturning",
        "calligraphy",
        "beekeeping",
        "life drawing",
        "kayaking",
    ],
}
# (speaker, statement, [(question, answer)]): speaker 0 is {a} (user role), 1 is {b}.
FACTS: list[tuple[int, str, list[tuple[str, str]]]] = [
    (
        0,
        "We adopted a {species} from the shelter on Saturday, we named her {pet}.",
        [("What is the name of {a}'s {species}?", "{pet}")],
    ),
    (
        0,
        "I signed up for {instrument} lessons, my teacher is a retired musician called {teacher}.",
        [
            ("Which instrument is {a} learning?", "{instrument}"),
            ("What is the name of {a}'s music teacher?", "{teacher}"),
        ],
    ),
    (
        1,
        "I am halfway through {title} by {author}, I keep reading it on the bus.",
        [("Who wrote the book {b} was reading on the bus?", "{author}")],
    ),
    (
        0,
        "Big news: I accepted an offer from {company}, I start as a {role} soon.",
        [
            ("Which company did {a} accept an offer from?", "{company}"),
            ("What role will {a} have in the new job?", "{role}"),
        ],
    ),
    (
        1,
        "My grandmother's {dish} always had {secret} in it, that was her secret.",
        [("What was the secret ingredient of {b}'s grandmother's {dish}?", "{secret}")],
    ),
    (
        0,
        "We booked flights to {place} for {month}, I have wanted to go for years.",
        [("Where is {a} travelling to in {month}?", "{place}")],
    ),
    (
        1,
        "The new flat is on {street}, number {number}, right above a bakery.",
        [
            ("On which street is {b}'s new flat?", "{street}"),
            ("What is the house number of {b}'s new flat?", "{number}"),
        ],
    ),
    (
        0,
        "The doctor says I am allergic to {allergen}, which explains a lot.",
        [("What did {a} find out they are allergic to?", "{allergen}")],
    ),
    (
        1,
        "The {plant} on the balcony finally flowered after three years of nothing.",
        [("Which plant on {b}'s balcony flowered?", "{plant}")],
    ),
    (
        0,
        "I finished the {race} in position {position}, out of two thousand runners!",
        [("In which position did {a} finish the {race}?", "{position}")],
    ),
    (
        1,
        "We sold the old {colour} {car} at last, it had over two hundred thousand on the clock.",
        [("What colour was the car {b} sold?", "{colour}")],
    ),
    (
        1,
        "Our daughter got the part of {play_role} in the school play, she is practising day and night.",
        [("Which part did {b}'s daughter get in the school play?", "{play_role}")],
    ),
    (
        1,
        "For ten years at the company my boss gave me {gift}, of all things.",
        [("What did {b}'s boss give them for ten years at the company?", "{gift}")],
    ),
    (
        0,
        "We are repainting the bedroom in {paint}, I chose the colour myself.",
        [("Which colour is {a} painting the bedroom?", "{paint}")],
    ),
]
# Pairs: the second statement only answers its question together with the first.
MULTI_HOP: list[tuple[tuple[int, str, list[tuple[str, str]]], tuple[int, str, list[tuple[str, str]]]]] = [
    (
        (
            1,
            "My brother {sibling} has a new job and is moving abroad next month.",
            [("What is the name of {b}'s brother?", "{sibling}")],
        ),
        (
            1,
            "{sibling} has settled in {city} now, he says the ferries there are wonderful.",
            [("Which city did {b}'s brother move to for his new job?", "{city}")],
        ),
    ),
    (
        (
            0,
            "My cousin {cousin} runs a {skill} class on weekends and talked me into joining.",
            [("What class does {a}'s cousin run on weekends?", "{skill}")],
        ),
        (
            0,
            "{cousin} is getting married in {wedding_city} and we are all invited!",
            [("Where is {a}'s cousin who runs the {skill} class getting married?", "{wedding_city}")],
        ),
    ),
]
# (past tense, question form): told on the day it happened; the answer is that sitting's date.
EVENTS = [
    ("passed my driving test", "pass the driving test"),
    ("signed the lease on the new flat", "sign the lease on the new flat"),
    ("got the keys to the allotment", "get the keys to the allotment"),
    ("handed in my thesis", "hand in the thesis"),
    ("had my first day at the new job", "have the first day at the new job"),
    ("finished painting the kitchen", "finish painting the kitchen"),
]
ADVERSARIAL = ["What is the name of {b}'s horse?", "Which football team does {a} support?"]

# Small talk: generic on purpose (no names or values from the answer lists), composed from
# parts so that sentences rarely repeat.
OPENERS = [
    "Hey {o}! It feels like ages since we last talked properly.",
    "Hi {o}, how has your week been treating you?",
    "Morning {o}! I have a coffee and ten minutes, tell me everything.",
    "{o}! Finally a quiet evening, I was hoping to catch you.",
    "Hello again {o}, sorry for going silent, things got busy.",
    "Evening {o}, are you free for a chat or is it a bad time?",
]
CLOSERS = [
    "I should go and make dinner, talk soon!",
    "Right, my tea is cold, let us catch up again soon.",
    "I have to run, but this was really nice.",
    "Speak soon, and good luck with everything this week!",
    "Going to bed now, it was great to chat.",
]
WHEN = [
    "On Sunday",
    "Yesterday",
    "Last night",
    "This morning",
    "After work",
    "Over the weekend",
    "On the way home",
    "During lunch",
    "Earlier today",
    "On my day off",
]
DID = [
    "cleaned out the garage",
    "walked along the canal",
    "tried to fix the wobbly table",
    "baked bread that refused to rise",
    "repainted the hallway door",
    "sorted a box of old photos",
    "went to the swimming pool",
    "helped a friend carry a sofa up four floors",
    "finally answered all my emails",
    "rearranged the living room",
    "got lost looking for a shop",
    "watched the rain from the window",
    "made far too much pasta",
    "took the long way round the park",
    "spent an hour on the phone with the bank",
    "fell asleep on the sofa",
    "ironed a mountain of shirts",
    "went to a quiz night at the pub",
    "planted some bulbs in the window box",
    "bought new running shoes",
    "cooked a curry from scratch",
    "listened to an old album start to finish",
    "tidied the shed",
    "visited the flea market",
    "wrote a long letter by hand",
    "fixed the squeaky cupboard door",
]
HOW = [
    "",
    " and it took forever",
    " with the radio on",
    ", which was more fun than it sounds",
    " before it got dark",
    " and then needed a nap",
    " and felt very grown up",
    " without much success",
]
THINGS = [
    "The bakery near the station",
    "That podcast everyone talks about",
    "The bus timetable",
    "Our neighbour's new fence",
    "The queue at the post office",
    "The new cafe on the corner",
    "The heating in our building",
    "My phone battery",
    "The roadworks outside",
    "The library's reading room",
    "The choir down the street",
    "Our washing machine",
    "The farmers' stall on Fridays",
    "The lift at work",
]
VERDICTS = [
    "is better than I expected",
    "has been driving me mad",
    "keeps surprising me",
    "is quieter these days",
    "is busier than ever",
    "has gone downhill a bit",
    "is my new favourite thing",
    "is a complete mystery to me",
]
FEELINGS = [
    "tired but happy",
    "a bit restless",
    "oddly calm",
    "very behind on everything",
    "quite hopeful",
    "ready for a holiday",
    "more organised than usual",
    "like I need a long walk",
]
BECAUSE = [
    "after the week I had",
    "now that the evenings are lighter",
    "for no clear reason",
    "since the schedule changed",
    "with everything going on",
    "after a decent night's sleep",
]
REACTIONS = [
    "Oh, that sounds like a lot.",
    "Ha, I know exactly what you mean.",
    "That is lovely to hear, honestly.",
    "Wow, I did not expect that!",
    "Oof, that sounds exhausting.",
    "Same here, it has been one of those weeks.",
    "That made me laugh.",
    "I love that.",
    "Good for you!",
    "Honestly, that is so typical.",
    "Oh no, poor you.",
    "That sounds like a proper adventure.",
]
FOLLOW_UPS = [
    "How did that go?",
    "Did it turn out the way you hoped?",
    "Are you going to do it again?",
    "What was the best part?",
    "Was everyone else happy with it too?",
    "How long did it take in the end?",
    "Would you recommend it?",
    "Did you manage to rest afterwards?",
    "What are you up to this week?",
    "Any plans for the weekend?",
]


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return f"{rng.choice(WHEN)} I {rng.choice(DID)}{rng.choice(HOW)}."
    if kind == 1:
        return f"{rng.choice(THINGS)} {rng.choice(VERDICTS)}."
    return f"I feel {rng.choice(FEELINGS)} {rng.choice(BECAUSE)}."


def _small_talk(rng: random.Random, count: int) -> list[str]:
    lines: list[str] = []
    for _ in range(count):
        if rng.random() < 0.35:
            lines.append(f"{rng.choice(REACTIONS)} {rng.choice(FOLLOW_UPS)}")
        else:
            said: dict[str, str] = {}
            for _ in range(rng.randint(1, 3)):
                sentence = _sentence(rng)
                said.setdefault(sentence.split(" ", 2)[1], sentence)  # one sentence per subject
            lines.append(" ".join(said.values()))
    return lines


@dataclass
class Fact:
    """A statement made once and the questions it answers (``category`` for all of them)."""

    speaker: int
    text: str
    qa: list[tuple[str, str]]
    category: str
    linked: Fact | None = None  # multi-hop: the earlier statement its questions also need
    sitting: int = 0
    msg_id: str = ""


def _values(rng: random.Random) -> list[dict[str, str]]:
    """Slot values of each conversation, drawn without replacement: no two chats share an
    answer, so another chat's answers in a window (the quality tests' control) are noise."""
    out: list[dict[str, str]] = [{} for _ in PAIRS]
    for slots, pool in POOLS.items():
        for values, picked in zip(out, rng.sample(pool, len(PAIRS)), strict=True):
            values.update(
                zip(slots.split(","), picked if isinstance(picked, tuple) else (picked,), strict=True)
            )
    return out


def _facts(rng: random.Random, names: tuple[str, str], values: dict[str, str]) -> list[Fact]:
    """The statements of one chat in the order they are made; the second halves of the
    multi-hop pairs come last, sittings after the statement they build on."""
    values = {**values, "a": names[0], "b": names[1]}

    def fact(speaker: int, text: str, qa: list[tuple[str, str]], category: str) -> Fact:
        filled = [(q.format(**values), ans.format(**values)) for q, ans in qa]
        return Fact(speaker, text.format(**values), filled, category)

    facts = [fact(*f, "single-hop") for f in FACTS]
    later = []
    for first, second in MULTI_HOP:
        facts.append(fact(*first, "single-hop"))
        later.append(fact(*second, "multi-hop"))
        later[-1].linked = facts[-1]
    for speaker, (did, do) in enumerate(rng.sample(EVENTS, 2)):
        facts.append(
            Fact(
                speaker,
                f"Guess what, I {did} this morning!",
                [(f"When did {names[speaker]} {do}?", "")],
                "temporal",
            )
        )
    rng.shuffle(facts)
    return facts + later


def _date_line(sitting: int, when: dt.datetime) -> str:
    hour = when.hour % 12 or 12
    return (
        f"[Sitting {sitting}, {when.day} {when:%B %Y}, {hour}:{when:%M} {'am' if when.hour < 12 else 'pm'}]"
    )


def conversation(n: int, rng: random.Random, values: dict[str, str]) -> dict[str, object]:
    """One chat with its QA records."""
    names = PAIRS[n]
    facts = _facts(rng, names, values)
    # Stated in sittings 1..SITTINGS-1, in order; the last sitting is small talk only.
    for i, fact in enumerate(facts):
        fact.sitting = 1 + i * (SITTINGS - 1) // len(facts)
    # Each chat in its own year, so a date answer of one chat is not half-found in another.
    when = dt.datetime(2019 + n, 1 + 2 * n, 3 + n, 9, 5) + dt.timedelta(minutes=37 * n)
    messages: list[dict[str, object]] = []
    qa: list[dict[str, object]] = []
    for sitting in range(1, SITTINGS + 1):
        if sitting > 1:
            when += dt.timedelta(
                days=rng.randint(3, 19), hours=rng.randint(-5, 6), minutes=rng.randint(0, 59)
            )
        date_line = _date_line(sitting, when)
        if sitting == 1:
            messages.append({"role": "system", "content": date_line})
        lines: list[tuple[str, Fact | None]] = [
            (line, None) for line in _small_talk(rng, rng.randint(18, 26))
        ]
        todays = [f for f in facts if f.sitting == sitting]
        for slot, fact in sorted(
            zip(rng.sample(range(2, len(lines)), len(todays)), todays, strict=True),
            key=lambda pair: pair[0],
            reverse=True,
        ):
            lines.insert(slot, (fact.text, fact))
        opener = rng.choice(OPENERS)
        speaker = rng.randint(0, 1)
        lines = [(opener.format(o=names[1 - speaker]), None), *lines, (rng.choice(CLOSERS), None)]
        for count, (text, fact) in enumerate(lines, 1):
            if fact is not None:
                speaker = fact.speaker
            elif count > 1 and rng.random() > 0.1:
                speaker = 1 - speaker
            content = f"{names[speaker]}: {text}"
            if count == 1 and sitting > 1:
                content = f"{date_line}\n{content}"
            msg_id = f"D{sitting}:{count}"
            messages.append({"role": ("user", "assistant")[speaker], "content": content, "msg_id": msg_id})
            if fact is None:
                continue
            fact.msg_id = msg_id
            evidence = [fact.linked.msg_id, msg_id] if fact.linked else [msg_id]
            for question, answer in fact.qa:
                # A temporal answer is the date in the sitting's date line.
                said = f"{when.day} {when:%B %Y}" if fact.category == "temporal" else answer
                qa.append(
                    {"question": question, "answer": said, "evidence": evidence, "category": fact.category}
                )
    a, b = names
    qa += [
        {"question": q.format(a=a, b=b), "answer": NOT_MENTIONED, "evidence": [], "category": "adversarial"}
        for q in ADVERSARIAL
    ]
    return {"id": f"chat-{n + 1}", "source": "ctxcore dialogue fixture (MIT)", "messages": messages, "qa": qa}


def render() -> str:
    """The whole file's text."""
    rng = random.Random(SEED)
    values = _values(rng)
    return "".join(
        json.dumps(conversation(n, rng, values[n]), ensure_ascii=False) + "\n" for n in range(len(PAIRS))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT}: {'up to date' if same else 'differs from the generator output'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
