"""Deterministic generators of files shaped like the public datasets people start from, with their mess.

Each function writes one file and returns the params overrides a user would set to train on it (dotted keys, as for
`trainflow params set` / `dvc exp run -S`). The signal is realistic (not separable), the mess is the usual one:

    passengers  Titanic-like CSV: quoted names with commas and quotes, Age missing as "" and as NA, Cabin mostly
                missing, a few missing Embarked; binary target Survived (sex, class, age, fare, plus noise).
    gems        diamonds-like CSV: carat, ordered categories cut/color/clarity, depth, table, x/y/z (some zeros);
                regression target price in dollars, skewed (log-price linear in log-carat and the grades).
    messages    SMS-spam-like header-less TSV `label<TAB>text` (ham/spam): lexical signal, shared words, URLs,
                numbers, mixed case, quotes inside texts (some at the start of a field).
    animals     Palmer-penguins-like CSV: three species, island, four measurements and sex, NA written as "NA";
                two rows with every measurement missing, some rows with sex missing.

    .venv/bin/python bench/data_shapes.py OUTDIR     # writes the four files and prints their overrides
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

Overrides = dict[str, Any]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _source(path: Path, root: Path | None) -> str:
    """data.source for `path`: relative to the project root when one is given (as a user writes it)."""
    path = Path(path)
    if root is not None:
        return os.path.relpath(path.resolve(), Path(root).resolve())
    return str(path)


def as_override_list(overrides: Overrides) -> list[str]:
    """{'data.exclude': ['a', 'b']} -> ['data.exclude=["a", "b"]']: JSON values are valid YAML."""
    return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]


# --- passengers (Titanic) ---------------------------------------------------------------------------------------

_SURNAMES = _words(
    "Braund Cumings Heikkinen Futrelle Allen Moran McCarthy Palsson Johnson Nasser Sandstrom Bonnell Saundercock "
    "Andersson Vestrom Hewlett Rice Williams Vander-Planke Masselmani Fynney Beesley McGowan Sloper Asplund Emir "
    "Fortune O'Dwyer Todoroff Uruchurtu Spencer Glynn Wheadon Meyer Holverson Mamee Cann Nicola-Yarred Ahlin "
    "Turpin Kraeff Laroche Devaney Rogers Lennon O'Driscoll Samaan Arnold-Franchi Panula Nosworthy Harper Faunthorpe "
    "Ostby Woolner Rugg Novel West Goodwin Sirayanian Icard Harris Skoog Stewart Moubarek Nye Crease Kink Jenkin "
    "Hood Chronopoulos Bing Moen Staneff Moutal Caldwell Dowdell Waelens Sheerlinck McDermott Carrau Ilett "
    "Backstrom Ford Slocovski Fortune Celotti Christmann Andreasson Chaffee Dean Coxon Shorney Goldschmidt Greenfield"
)
_MALE = _words("John William Charles George Thomas James Henry Edward Frederick Arthur Joseph Richard Karl Patrick")
_FEMALE = _words("Mary Anna Elizabeth Margaret Alice Helen Ellen Edith Florence Annie Bertha Emily Maria Sarah Kate")
_NICKS = ("Jim", "Bertie", "Nellie", "Lily", "Kitty", "Molly", "Harry", "Jack")


def _passenger_name(rng: np.random.Generator, female: bool, age: float) -> str:
    surname = str(rng.choice(_SURNAMES))
    if female:
        first = " ".join(rng.choice(_FEMALE, size=int(rng.integers(1, 3))))
        if age == age and age < 18 or rng.random() < 0.35:
            name = f"{surname}, Miss. {first}"
        else:  # married: under her husband's name, her own in parentheses
            husband = " ".join(rng.choice(_MALE, size=int(rng.integers(1, 3))))
            name = f"{surname}, Mrs. {husband} ({first} {rng.choice(_SURNAMES)})"
    else:
        first = " ".join(rng.choice(_MALE, size=int(rng.integers(1, 3))))
        title = "Master" if age == age and age < 13 else str(rng.choice(["Mr", "Mr", "Mr", "Mr", "Dr", "Rev"]))
        name = f"{surname}, {title}. {first}"
    if rng.random() < 0.06:  # a nickname in double quotes, as in the real file
        name += f' "{rng.choice(_NICKS)}"'
    return name


def _ticket(rng: np.random.Generator, pclass: int) -> str:
    kind = rng.random()
    number = int(rng.integers(1000, 400000))
    if pclass == 1 and kind < 0.4:
        return f"PC {number % 100000}"
    if kind < 0.12:
        return f"A/5 {number % 100000}"
    if kind < 0.2:
        return f"STON/O2. {3100000 + number % 10000}"
    if kind < 0.25:
        return f"C.A. {number % 100000}"
    if kind < 0.28:
        return f"W./C. {number % 10000}"
    return str(number)


def passengers(path: Path, n: int = 1300, seed: int = 1912, root: Path | None = None) -> Overrides:
    """A Titanic-like CSV of `n` passengers; returns the overrides for a binary classifier of Survived."""
    rng = np.random.default_rng(seed)
    pclass = rng.choice([1, 2, 3], size=n, p=[0.24, 0.21, 0.55])
    female = rng.random(n) < np.select([pclass == 1, pclass == 2], [0.44, 0.41], 0.29)
    age = np.clip(rng.normal(np.select([pclass == 1, pclass == 2], [38.0, 30.0], 25.0), 13.5), 0.42, 80.0)
    child = rng.random(n) < 0.08
    age = np.where(child, rng.uniform(0.42, 12.0, n), age)
    age = np.where(age < 1, np.round(age, 2), np.round(age * 2) / 2)  # whole or half years, months for babies
    sibsp = np.minimum(rng.poisson(np.where(child, 1.6, 0.4)), 8)
    parch = np.minimum(rng.poisson(np.where(child, 1.5, 0.3)), 6)
    base_fare = np.select([pclass == 1, pclass == 2], [60.0, 17.0], 9.0)
    fare = base_fare * np.exp(rng.normal(0, 0.55, n)) * (1 + 0.35 * (sibsp + parch))
    fare = np.where(rng.random(n) < 0.012, 0.0, np.round(fare, 4))  # crew-like zero fares
    embarked = rng.choice(["S", "C", "Q"], size=n, p=[0.72, 0.19, 0.09])
    embarked = np.where((pclass == 1) & (rng.random(n) < 0.25), "C", embarked)

    # Survival: women and children first, by class; fare helps a little; plus plenty of noise.
    score = (
        2.5 * female
        - 0.95 * (pclass - 1)
        - 0.022 * (age - 30)
        + 1.3 * (age < 10)
        + 0.25 * np.log1p(fare)
        - 0.35 * np.maximum(sibsp + parch - 3, 0)
        + 0.2 * (embarked == "C")
        + rng.logistic(0, 0.75, n)
    )
    survived = (score > np.quantile(score, 0.62)).astype(int)  # 38% positive

    rows = []
    for i in range(n):
        a = float(age[i])
        name = _passenger_name(rng, bool(female[i]), a)
        age_text = f"{a:g}"
        if rng.random() < 0.2:  # missing ages, written two ways
            age_text = "" if rng.random() < 0.6 else "NA"
        if pclass[i] == 1 and rng.random() < 0.8 or rng.random() < 0.06:
            deck = str(rng.choice(list("ABCDE") if pclass[i] == 1 else list("DEFG")))
            cabin = " ".join(f"{deck}{int(rng.integers(1, 130))}" for _ in range(1 + int(rng.random() < 0.1)))
        else:
            cabin = ""
        emb = "" if rng.random() < 0.0025 else str(embarked[i])
        rows.append(
            [
                i + 1,
                int(survived[i]),
                int(pclass[i]),
                name,
                "female" if female[i] else "male",
                age_text,
                int(sibsp[i]),
                int(parch[i]),
                _ticket(rng, int(pclass[i])),
                f"{fare[i]:.4f}".rstrip("0").rstrip("."),
                cabin,
                emb,
            ]
        )
    header = ["PassengerId", "Survived", "Pclass", "Name", "Sex", "Age", "SibSp", "Parch", "Ticket", "Fare"]
    header += ["Cabin", "Embarked"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    return {
        "data.source": _source(path, root),
        "data.target": "Survived",
        "data.task": "classification",
        "data.exclude": ["PassengerId", "Name", "Ticket", "Cabin"],
        "register.model_name": "passengers",
    }


# --- gems (diamonds) --------------------------------------------------------------------------------------------

CUTS = ("Fair", "Good", "Very Good", "Premium", "Ideal")
COLORS = ("D", "E", "F", "G", "H", "I", "J")  # D is best
CLARITIES = ("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF")  # IF is best


def gems(path: Path, n: int = 50_000, seed: int = 1888, root: Path | None = None) -> Overrides:
    """A diamonds-like CSV of `n` stones; returns the overrides for a regression of price (dollars)."""
    rng = np.random.default_rng(seed)
    # Carat: a skewed bulk plus the spikes at "magic" sizes that real listings have.
    carat = np.exp(rng.normal(-0.45, 0.55, n))
    magic = np.array([0.3, 0.4, 0.5, 0.7, 0.9, 1.0, 1.01, 1.2, 1.5, 2.0])
    spike = rng.random(n) < 0.45
    carat = np.where(spike, rng.choice(magic, n) + np.abs(rng.normal(0, 0.01, n)), carat)
    carat = np.round(np.clip(carat, 0.2, 5.01), 2)
    cut = rng.choice(len(CUTS), size=n, p=[0.03, 0.09, 0.22, 0.26, 0.40])
    color = rng.choice(len(COLORS), size=n, p=[0.125, 0.18, 0.177, 0.21, 0.154, 0.1, 0.054])
    clarity = rng.choice(len(CLARITIES), size=n, p=[0.014, 0.17, 0.242, 0.227, 0.151, 0.094, 0.068, 0.034])
    # Bigger stones tend to have worse colour and clarity (as in the real data).
    big = carat > 1.0
    clarity = np.where(big & (rng.random(n) < 0.3), np.maximum(clarity - 2, 0), clarity)
    color = np.where(big & (rng.random(n) < 0.3), np.minimum(color + 2, 6), color)

    log_price = (
        8.45
        + 1.72 * np.log(carat)
        - 0.13 * np.log(carat) ** 2
        + np.array([-0.2, -0.08, 0.0, 0.03, 0.06])[cut]
        - 0.085 * color
        + np.array([-0.6, -0.1, 0.0, 0.09, 0.16, 0.26, 0.33, 0.42])[clarity]
        + rng.normal(0, 0.11, n)
    )
    price = np.clip(np.round(np.exp(log_price)), 326, 18823).astype(int)

    depth = np.round(np.clip(rng.normal(61.75, 1.4, n) + np.where(cut == 0, rng.normal(2.5, 2.5, n), 0), 43, 79), 1)
    table = np.round(np.clip(rng.normal(57.4, 2.2, n) - 0.8 * (cut == 4) + 2.0 * (cut == 0), 43, 95))
    diameter = 6.45 * np.cbrt(carat) * np.exp(rng.normal(0, 0.01, n))
    x = np.round(diameter * (1 + np.abs(rng.normal(0, 0.006, n))), 2)
    y = np.round(diameter * (1 - np.abs(rng.normal(0, 0.006, n))), 2)
    z = np.round(depth / 100 * (x + y) / 2, 2)
    # Data-entry errors of the real file: a few zero dimensions.
    for col in (x, y, z):
        col[rng.random(n) < 0.0004] = 0.0

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["carat", "cut", "color", "clarity", "depth", "table", "price", "x", "y", "z"])
        for i in range(n):
            w.writerow(
                [
                    f"{carat[i]:g}",
                    CUTS[cut[i]],
                    COLORS[color[i]],
                    CLARITIES[clarity[i]],
                    f"{depth[i]:g}",
                    f"{table[i]:g}",
                    int(price[i]),
                    f"{x[i]:.2f}",
                    f"{y[i]:.2f}",
                    f"{z[i]:.2f}",
                ]
            )
    return {
        "data.source": _source(path, root),
        "data.target": "price",
        "data.task": "regression",
        "register.model_name": "gems",
    }


# --- messages (SMS spam) ----------------------------------------------------------------------------------------

_COMMON = _words(
    "i you u the to a and is in it my me for your of have on that are be at now so can do will just get not "
    "with what this we ok know when im if no all call go got like come good up out then it's there time day"
)
_HAM = _words(
    "lol haha sorry later home tonight dinner love miss babe yeah gonna wanna pls thanks lor da lunch sleep "
    "class work meet movie mum dad bus wait soon coming hey hi oh k ya dunno tomorrow morning night going "
    "already still yet think feel happy sad tired hungry eat watch leave back finish pick shopping bed "
    "birthday party weekend friday saturday sunday car train office boss exam study lecture remember "
    "text reply phone message tell said ask how where why sure maybe nice cool great fine alright xx"
)
_SPAM = _words(
    "free win winner won prize claim cash award guaranteed urgent txt text reply stop mobile camera "
    "ringtone tone offer selected draw bonus voucher entry service customer delivery 18+ apply "
    "unsubscribe subscription weekly chat dating sexy hot landline contact expires valid pobox "
    "congratulations congrats nokia video network premium rate cost per min msg pounds receive collect"
)
_SPAM_PHRASES = (
    "call now",
    "to claim",
    "you have won",
    "txt STOP to",
    "reply YES",
    "for free",
    "guaranteed prize",
    "valid 12hrs only",
    "T&C apply",
    "urgent!",
    "FREE entry",
    "500 cash",
)
_QUOTES = ('"ok"', '"that\'s it"', '"fine"', '"no"', '"love u"', '"whatever"')


def _spam_number(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 5))
    if kind == 0:
        return f"0{int(rng.integers(8000000000, 9099999999))}"
    if kind == 1:
        return f"£{int(rng.choice([100, 250, 500, 1000, 2000, 5000]))}"
    if kind == 2:
        return f"{int(rng.integers(10000, 89999))}"
    if kind == 3:
        site = rng.choice(["getzed", "txt82", "win-now", "ringtoneking", "movietrivia"])
        return f"www.{site}.{rng.choice(['co.uk', 'com', 'net'])}"
    return f"{int(rng.integers(1, 9))}{rng.choice(['50p', 'p/min', 'x', 'txt'])}"


def _case(rng: np.random.Generator, word: str, upper: float) -> str:
    r = rng.random()
    if r < upper:
        return word.upper()
    if r < upper + 0.1:
        return word.capitalize()
    return word


def _message(rng: np.random.Generator, spam: bool) -> str:
    words: list[str] = []
    if spam:
        length = int(rng.integers(12, 32))
        p_spam = rng.uniform(0.12, 0.5)  # some spam is subtle
        for _ in range(length):
            r = rng.random()
            if r < p_spam:
                words.append(_case(rng, str(rng.choice(_SPAM)), 0.3))
            elif r < p_spam + 0.08:
                words.append(_spam_number(rng))
            elif r < p_spam + 0.14:
                words.append(str(rng.choice(_SPAM_PHRASES)))
            elif r < p_spam + 0.22:
                words.append(str(rng.choice(_HAM)))
            else:
                words.append(_case(rng, str(rng.choice(_COMMON)), 0.1))
    else:
        length = int(rng.integers(3, 24))
        for _ in range(length):
            r = rng.random()
            if r < 0.5:
                words.append(_case(rng, str(rng.choice(_HAM)), 0.03))
            elif r < 0.515:  # ham shares some spam words: "call me", "text me", "won the game", "free tonight"
                words.append(str(rng.choice(_SPAM[:20])))
            elif r < 0.52:
                words.append(str(int(rng.integers(1, 60))))
            else:
                words.append(_case(rng, str(rng.choice(_COMMON)), 0.03))
        if rng.random() < 0.05:
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(_QUOTES)))
    text = " ".join(words)
    # Punctuation and the odd emoticon.
    text += str(rng.choice(["", "", ".", "!", "?", "...", " :)", " :-(", "!!", " ;-)"]))
    if rng.random() < 0.3:
        text = text[0].upper() + text[1:]
    return text


def messages(
    path: Path, n: int = 5000, seed: int = 2012, root: Path | None = None, unbalanced_quotes: int = 1
) -> Overrides:
    """An SMS-spam-like header-less TSV (label, text) of `n` messages; ~13% spam; returns the text overrides.

    The file is not CSV-quoted (as the real SMSSpamCollection): ~1% of texts start with a quoted word, and
    `unbalanced_quotes` ham texts start with a quote that never closes (a reader that honours CSV quoting in this
    file merges the following lines into that text).
    """
    rng = np.random.default_rng(seed)
    spam = rng.random(n) < 0.13
    unbalanced = set(rng.choice(np.flatnonzero(~spam)[10:-10], size=unbalanced_quotes, replace=False).tolist())
    lines = []
    for i in range(n):
        text = _message(rng, bool(spam[i])).replace("\t", " ")
        if rng.random() < 0.01:  # a quoted word at the very start of the field
            text = f'"{text.split(" ")[0]}" {" ".join(text.split(" ")[1:])}'.rstrip()
        if i in unbalanced:
            text = '"' + text
        lines.append(f"{'spam' if spam[i] else 'ham'}\t{text}\n")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.writelines(lines)
    return {
        "data.source": _source(path, root),
        "data.format": "tsv",
        "data.header": False,
        "data.columns": ["label", "text"],
        "data.target": "label",
        "data.text_column": "text",
        "data.task": "classification",
        "register.model_name": "messages",
    }


# --- animals (Palmer penguins) ----------------------------------------------------------------------------------

# species -> (share, {island: share}, means (bill_length, bill_depth, flipper, mass), sds)
_PENGUINS = {
    "Adelie": (152, {"Torgersen": 0.34, "Biscoe": 0.29, "Dream": 0.37}, (38.8, 18.35, 190.0, 3700.0)),
    "Chinstrap": (68, {"Dream": 1.0}, (48.8, 18.4, 195.8, 3733.0)),
    "Gentoo": (124, {"Biscoe": 1.0}, (47.5, 14.98, 217.2, 5076.0)),
}
_PENGUIN_SD = np.array([2.2, 0.9, 5.8, 330.0])  # within species and sex
_PENGUIN_SEX = np.array([1.5, 0.7, 3.5, 340.0])  # half the male-female difference


def animals(path: Path, n: int = 344, seed: int = 2007, root: Path | None = None) -> Overrides:
    """A Palmer-penguins-like CSV of `n` birds (NA written as "NA"); returns the overrides for species."""
    rng = np.random.default_rng(seed)
    counts = np.array([v[0] for v in _PENGUINS.values()], dtype=float)
    species = rng.choice(list(_PENGUINS), size=n, p=counts / counts.sum())
    rows = []
    for s in species:
        _, islands, means = _PENGUINS[str(s)]
        island = str(rng.choice(list(islands), p=list(islands.values())))
        male = rng.random() < 0.5
        size = rng.normal()  # one latent size: the four measurements are correlated
        own = rng.normal(size=4)
        values = np.array(means) + (1 if male else -1) * _PENGUIN_SEX + _PENGUIN_SD * (0.6 * size + 0.8 * own)
        rows.append(
            [
                str(s),
                island,
                f"{values[0]:.1f}",
                f"{values[1]:.1f}",
                f"{round(values[2])}",
                f"{round(values[3] / 25) * 25}",
                "male" if male else "female",
            ]
        )
    for i in rng.choice(n, size=2, replace=False):  # two birds never measured
        rows[i][2:] = ["NA"] * 5
    for i in rng.choice(n, size=9, replace=False):  # and some of unknown sex
        rows[i][6] = "NA"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "sex"])
        w.writerows(rows)
    return {
        "data.source": _source(path, root),
        "data.target": "species",
        "data.task": "classification",
        "register.model_name": "animals",
    }


SHAPES = {
    "passengers": (passengers, "passengers.csv"),
    "gems": (gems, "gems.csv"),
    "messages": (messages, "SMSSpamCollection"),
    "animals": (animals, "penguins.csv"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "/tmp/trainflow-shapes")
    for name, (make, filename) in SHAPES.items():
        overrides = make(out / filename)
        print(name, json.dumps(overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
