"""The oracle of the CPython census (tests/integration/test_census_python.py): a known
population of class instances (with and without __slots__), bytes, dicts and lists, counted
by the program itself and by gc.get_objects(), printed on the "ready" line as JSON.
With the argument "churn", a thread allocates and drops unrelated lists and dicts without
pause. Commands on stdin: "grow N" makes N more Leaky instances (then prints "grown N");
"stats" writes sys._debugmallocstats() to stderr (then prints "stats")."""

import gc
import json
import random
import sys


class Plain:
    def __init__(self, i):
        self.i = i
        self.name = "p"


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, i):
        self.a = i
        self.b = None


class Leaky:
    def __init__(self, i):
        self.i = i


PLAIN, SLOTTED, BYTES, DICTS, LISTS = 30000, 20000, 8000, 6000, 5000
keep = [Plain(i) for i in range(PLAIN)]
keep += [Slotted(i) for i in range(SLOTTED)]
keep += [bytes(40 + i % 300) for i in range(BYTES)]
keep += [{"k": i, "v": -i} for i in range(DICTS)]
keep += [[i, i + 1, i + 2] for i in range(LISTS)]
leaks = []


def churn():
    rng = random.Random(3)
    slots = [None] * 5000
    while True:
        i = rng.randrange(len(slots))
        if rng.random() < 0.5:
            slots[i] = [rng.random() for _ in range(rng.randrange(1, 40))]
        else:
            slots[i] = {"k": str(i)}


counts = {}
for obj in gc.get_objects():
    name = type(obj).__name__
    counts[name] = counts.get(name, 0) + 1
print(
    "ready "
    + json.dumps(
        {
            "built": {
                "Plain": PLAIN,
                "Slotted": SLOTTED,
                "bytes": BYTES,
                "dict": DICTS,
                "list": LISTS,
            },
            "gc": counts,
        }
    ),
    flush=True,
)
for line in sys.stdin:
    words = line.split()
    if words[:1] == ["grow"]:
        leaks.extend(Leaky(i) for i in range(int(words[1])))
        print(f"grown {len(leaks)}", flush=True)
    elif words[:1] == ["stats"]:
        sys._debugmallocstats()
        print("stats", flush=True)
