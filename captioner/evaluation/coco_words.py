"""Which caption words name which COCO category: a synonym table and a phrase matcher.

:data:`CATEGORY_WORDS` maps each of the 80 COCO instance categories to the singular words and phrases
captions use for it; :func:`plural` adds the plural of each (regular English rules plus a short list of
irregular forms). Phrases of two words ("traffic light", "hot dog") win over their last word alone, so
"hot dog" names the food, not the animal. Words that could name several categories ("glass",
"board", "screen") are left out rather than guessed. A word only counts where its category is in the
image, so the colour "orange" next to a fruit bowl of oranges is the one confusion left.
"""

from __future__ import annotations

CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    "person": ("person", "man", "woman", "boy", "girl", "child", "kid", "baby", "toddler", "guy", "lady",
               "gentleman", "player", "skier", "surfer", "skateboarder", "snowboarder", "rider", "biker",
               "pitcher", "batter", "catcher", "umpire", "officer", "policeman", "chef", "people", "adult",
               "teenager", "teen", "student", "worker", "tourist", "spectator", "crowd"),
    "bicycle": ("bicycle", "bike", "cycle"),
    "car": ("car", "automobile", "taxi", "cab", "sedan", "suv", "van", "jeep"),
    "motorcycle": ("motorcycle", "motorbike", "motor bike", "scooter", "moped", "dirt bike"),
    "airplane": ("airplane", "plane", "jet", "aircraft", "airliner", "jetliner", "aeroplane"),
    "bus": ("bus", "minibus"),
    "train": ("train", "locomotive", "tram", "subway", "railcar"),
    "truck": ("truck", "lorry", "pickup", "fire truck"),
    "boat": ("boat", "ship", "sailboat", "canoe", "kayak", "yacht", "ferry", "raft", "vessel"),
    "traffic light": ("traffic light", "stop light", "stoplight", "traffic signal"),
    "fire hydrant": ("fire hydrant", "hydrant"),
    "stop sign": ("stop sign",),
    "parking meter": ("parking meter", "meter"),
    "bench": ("bench", "park bench"),
    "bird": ("bird", "pigeon", "seagull", "gull", "duck", "goose", "parrot", "owl", "eagle", "swan", "chicken",
             "hen", "rooster", "sparrow", "crow", "hawk", "pelican", "penguin", "turkey"),
    "cat": ("cat", "kitten", "kitty"),
    "dog": ("dog", "puppy", "pup", "doggy", "hound"),
    "horse": ("horse", "pony", "foal", "stallion", "mare"),
    "sheep": ("sheep", "lamb", "ram", "ewe"),
    "cow": ("cow", "cattle", "bull", "calf", "ox", "oxen", "steer"),
    "elephant": ("elephant",),
    "bear": ("bear", "grizzly", "polar bear", "brown bear", "black bear"),
    "zebra": ("zebra",),
    "giraffe": ("giraffe",),
    "backpack": ("backpack", "back pack", "rucksack", "knapsack"),
    "umbrella": ("umbrella", "parasol"),
    "handbag": ("handbag", "purse", "hand bag"),
    "tie": ("tie", "necktie", "bow tie"),
    "suitcase": ("suitcase", "suit case", "luggage", "briefcase"),
    "frisbee": ("frisbee", "flying disc"),
    "skis": ("skis", "ski"),
    "snowboard": ("snowboard",),
    "sports ball": ("ball", "soccer ball", "football", "baseball", "basketball", "tennis ball", "volleyball",
                    "softball"),
    "kite": ("kite",),
    "baseball bat": ("baseball bat", "bat"),
    "baseball glove": ("baseball glove", "glove", "mitt", "baseball mitt"),
    "skateboard": ("skateboard", "skate board"),
    "surfboard": ("surfboard", "surf board"),
    "tennis racket": ("tennis racket", "racket", "racquet", "tennis racquet"),
    "bottle": ("bottle",),
    "wine glass": ("wine glass", "wineglass", "champagne glass"),
    "cup": ("cup", "mug", "coffee cup", "teacup"),
    "fork": ("fork",),
    "knife": ("knife",),
    "spoon": ("spoon",),
    "bowl": ("bowl",),
    "banana": ("banana",),
    "apple": ("apple",),
    "sandwich": ("sandwich", "burger", "hamburger"),
    "orange": ("orange",),
    "broccoli": ("broccoli",),
    "carrot": ("carrot",),
    "hot dog": ("hot dog", "hotdog"),
    "pizza": ("pizza",),
    "donut": ("donut", "doughnut"),
    "cake": ("cake", "cupcake", "cheesecake"),
    "chair": ("chair", "stool", "armchair"),
    "couch": ("couch", "sofa", "loveseat"),
    "potted plant": ("potted plant", "plant", "houseplant", "flower pot", "flowerpot"),
    "bed": ("bed",),
    "dining table": ("dining table", "table", "desk"),
    "toilet": ("toilet", "urinal", "commode"),
    "tv": ("tv", "television", "tv set", "monitor"),
    "laptop": ("laptop", "computer"),
    "mouse": ("mouse", "computer mouse"),
    "remote": ("remote", "controller", "remote control", "wii remote"),
    "keyboard": ("keyboard",),
    "cell phone": ("cell phone", "phone", "cellphone", "smartphone", "mobile phone", "iphone"),
    "microwave": ("microwave",),
    "oven": ("oven", "stove"),
    "toaster": ("toaster",),
    "sink": ("sink",),
    "refrigerator": ("refrigerator", "fridge", "freezer"),
    "book": ("book", "novel"),
    "clock": ("clock",),
    "vase": ("vase",),
    "scissors": ("scissors",),
    "teddy bear": ("teddy bear", "teddy", "stuffed animal", "stuffed bear"),
    "hair drier": ("hair drier", "hair dryer", "hairdryer", "blow dryer"),
    "toothbrush": ("toothbrush", "tooth brush"),
}

_IRREGULAR = {"man": "men", "woman": "women", "child": "children", "person": "people", "gentleman": "gentlemen",
              "policeman": "policemen", "knife": "knives", "calf": "calves", "ox": "oxen", "mouse": "mice",
              "goose": "geese", "sheep": "sheep", "cattle": "cattle", "people": "people", "skis": "skis",
              "scissors": "scissors", "broccoli": "broccoli", "luggage": "luggage"}


def plural(phrase: str) -> str:
    """The plural of a word or of a phrase's last word: "bus" -> "buses", "baby" -> "babies"."""
    *head, word = phrase.split()
    if word in _IRREGULAR:
        word = _IRREGULAR[word]
    elif word.endswith(("s", "x", "z", "ch", "sh")):
        word += "es"
    elif word.endswith("y") and word[-2:-1] not in "aeiou":
        word = word[:-1] + "ies"
    else:
        word += "s"
    return " ".join([*head, word])


def _phrase_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for category, words in CATEGORY_WORDS.items():
        for word in words:
            for form in (word, plural(word)):
                if table.setdefault(form, category) != category:
                    raise ValueError(f"'{form}' names both {table[form]} and {category}")
    return table


PHRASE_CATEGORY: dict[str, str] = _phrase_table()
"""Every singular and plural word or two-word phrase of :data:`CATEGORY_WORDS` -> its category."""


def phrase_categories(words: list[str]) -> list[tuple[int, str]]:
    """``(position, category)`` for every category phrase in ``words``, positioned at the phrase's last
    word; two-word phrases are matched before single words, left to right, without overlaps."""
    found, i = [], 0
    while i < len(words):
        pair = " ".join(words[i:i + 2])
        if i + 1 < len(words) and pair in PHRASE_CATEGORY:
            found.append((i + 1, PHRASE_CATEGORY[pair]))
            i += 2
        elif words[i] in PHRASE_CATEGORY:
            found.append((i, PHRASE_CATEGORY[words[i]]))
            i += 1
        else:
            i += 1
    return found
