#!/usr/bin/env python3
"""rag_data.py - seeded generator of a synthetic RAG-shaped multi-document QA task.

Every prompt is a fresh random "world": made-up countries and people whose
facts are drawn at random, so nothing can be memorised; the answer must be
read from the documents of that prompt.

Prompt layout (plain text, no ChatML; SEP = "<|pic_sep|>"):

    SYSTEM SEP doc_1 SEP doc_2 SEP ... SEP doc_n SEP question

  SYSTEM    "Answer the question with the documents.\\n"
  doc_i     "Document about Zorvia, a country. The capital of Zorvia is Quellam. ...\\n"
            a country profile, a person profile or a filler passage
  question  "Question: What is the capital of Zorvia?\\nAnswer: The capital of Zorvia is" (a cloze)
  answer    " Quellam" (the model emits it, then <|im_end|>); the JSONL field
            `answer` holds the stripped text "Quellam".

Question types (`qtype`; `hops` = documents needed):
  country_attr  capital / population / leader / language / founding year of a country    1
  person_attr   birth year / home city / job of a person                                  1
  reverse       "Which country has the capital Quellam?"                                 1
  twohop_doc    "What is the population of the country whose capital is Quellam?"        1 (two facts)
  twohop_xdoc   "In which year was the leader of Zorvia born?" (country doc -> person)   2

The other documents are distractors (other countries and people with the same
kinds of facts, filler passages). The order of the documents is random.

As a library (tools/train_model.py): `World(rng, stage)` / `make_example`.
As a tool: writes train/val/test JSONL:

    tools/rag_data.py --out models/default/data --seed 1234 \\
        --train 20000 --val 1000 --test 1000

JSONL fields: id, split, prompt (segments joined by SEP), segments (list),
answer, qtype, hops, n_docs, gold_docs (indexes into the documents, 0-based),
max_attrs.
"""

import argparse
import json
import os
import random

SEP = "<|pic_sep|>"
EOS = "<|im_end|>"
SYSTEM = "Answer the question with the documents.\n"

SYLLABLES = (
    "ba bel cor da dor el fen gar hal is ka kel lan lor ma mir nor ol pa quel ra ren sa sil "
    "tal tor ul va ven wyn xa yor za zor an ek im ost ur bri cla dre fro gla pra tre vo lu "
    "mon tas gen rik"
).split()

JOBS = (
    "baker farmer teacher doctor painter sailor miner writer singer smith "
    "weaver hunter potter builder judge merchant"
).split()

FILLER_NOUNS = "river mountain forest lake bridge tower market harbour valley road".split()
FILLER_ADJ = "old long quiet busy green cold famous small wide dark".split()

# (attribute, statement templates, question template); {e} entity, {v} value
COUNTRY_ATTRS = {
    "capital": (["The capital of {e} is {v}.", "{e}'s capital is {v}."], "What is the capital of {e}?"),
    "population": (["The population of {e} is {v}.", "{e}'s population is {v}."],
                   "What is the population of {e}?"),
    "leader": (["The leader of {e} is {v}.", "{e} is led by {v}."], "Who is the leader of {e}?"),
    "language": (["The language of {e} is {v}.", "People in {e} speak {v}."],
                 "What language is spoken in {e}?"),
    "founded": (["{e} was founded in {v}.", "The founding year of {e} is {v}."],
                "In which year was {e} founded?"),
}
PERSON_ATTRS = {
    "born": (["{e} was born in {v}.", "The birth year of {e} is {v}."], "In which year was {e} born?"),
    "city": (["{e} lives in {v}.", "The home of {e} is {v}."], "Where does {e} live?"),
    "job": (["{e} works as a {v}.", "The job of {e} is {v}."], "What is the job of {e}?"),
}
# reverse / two-hop questions over the capital (the key) of a country
REVERSE_Q = "Which country has the capital {v}?"
TWOHOP_DOC_Q = {
    "population": "What is the population of the country whose capital is {v}?",
    "leader": "Who is the leader of the country whose capital is {v}?",
    "founded": "In which year was the country whose capital is {v} founded?",
}
TWOHOP_XDOC_Q = {
    "born": "In which year was the leader of {e} born?",
    "city": "Where does the leader of {e} live?",
    "job": "What is the job of the leader of {e}?",
}

# The answer line is a cloze: the question is followed by "Answer:" and the
# start of the statement whose next words are the answer, e.g.
#   Question: What is the capital of Zorvia?\nAnswer: The capital of Zorvia is
# The one-hop clozes repeat the documents' main phrasing (FIRST_PHRASING of the
# facts), so the answer is read by matching the statement in the right
# document; the reverse and two-hop clozes do not occur in any document.
FIRST_PHRASING = 0.8
COUNTRY_CLOZE = {a: t[0][0].split(" {v}")[0] for a, t in COUNTRY_ATTRS.items()}
PERSON_CLOZE = {a: t[0][0].split(" {v}")[0] for a, t in PERSON_ATTRS.items()}
REVERSE_CLOZE = "The country with the capital {v} is"
TWOHOP_DOC_CLOZE = {
    "population": "The population of the country whose capital is {v} is",
    "leader": "The leader of the country whose capital is {v} is",
    "founded": "The country whose capital is {v} was founded in",
}
TWOHOP_XDOC_CLOZE = {
    "born": "The leader of {e} was born in",
    "city": "The leader of {e} lives in",
    "job": "The leader of {e} works as a",
}


def qa_text(question, cloze, **kw):
    """The question segment's text after "Question: "."""
    return f"{question.format(**kw)}\nAnswer: {cloze.format(**kw)}"


QTYPE_WEIGHTS = {"country_attr": 40, "person_attr": 20, "reverse": 10, "twohop_doc": 15, "twohop_xdoc": 15}

# curriculum stages: (min docs, max docs, max attributes per profile)
# (stage 0, a single document, is a training warm-up for the copy mechanism)
STAGES = [(1, 1, 3), (2, 3, 3), (2, 6, 4), (2, 10, 5), (2, 16, 5)]
FINAL_STAGE = len(STAGES) - 1


class World:
    """One prompt's random world: unique names and values for everything."""

    def __init__(self, rng, stage=FINAL_STAGE, n_docs=None):
        self.rng = rng
        lo, hi, self.max_attrs = STAGES[stage]
        self.n_docs = n_docs if n_docs is not None else rng.randint(lo, hi)
        self.used = set()
        self.docs = []  # list of dict(kind, name, facts{attr: value}, order[list of attr], extra)

    # -- unique values --
    def _unique(self, make):
        for _ in range(1000):
            v = make()
            if v not in self.used:
                self.used.add(v)
                return v
        raise RuntimeError("name space exhausted")

    def name(self):
        def make():
            k = self.rng.choice((2, 2, 3))
            return "".join(self.rng.choice(SYLLABLES) for _ in range(k)).capitalize()

        return self._unique(make)

    def number(self, lo, hi):
        return self._unique(lambda: str(self.rng.randint(lo, hi)))

    def value(self, attr):
        if attr in ("capital", "city", "leader", "language"):
            return self.name()
        if attr == "population":
            return self.number(100, 9999)
        if attr in ("founded", "born"):
            return self.number(1000, 1999)
        if attr == "job":
            return self.rng.choice(JOBS)  # jobs may repeat across people
        raise KeyError(attr)

    # -- documents --
    def country(self, need=(), leader=None):
        attrs = list(need)
        others = [a for a in COUNTRY_ATTRS if a not in attrs]
        self.rng.shuffle(others)
        k = self.rng.randint(max(len(attrs), 2), self.max_attrs)
        attrs += others[: max(0, k - len(attrs))]
        facts = {a: (leader if a == "leader" and leader else self.value(a)) for a in attrs}
        self.rng.shuffle(attrs)
        d = dict(kind="country", name=self.name(), facts=facts, order=attrs)
        self.docs.append(d)
        return d

    def person(self, need=(), name=None):
        attrs = list(need)
        others = [a for a in PERSON_ATTRS if a not in attrs]
        self.rng.shuffle(others)
        k = self.rng.randint(max(len(attrs), 1), min(3, self.max_attrs))
        attrs += others[: max(0, k - len(attrs))]
        facts = {a: self.value(a) for a in attrs}
        self.rng.shuffle(attrs)
        d = dict(kind="person", name=name or self.name(), facts=facts, order=attrs)
        self.docs.append(d)
        return d

    def filler(self):
        n = self.rng.randint(1, 3)
        sents = []
        for _ in range(n):
            noun, adj = self.rng.choice(FILLER_NOUNS), self.rng.choice(FILLER_ADJ)
            sents.append(f"The {adj} {noun} of {self.name()} is near {self.name()}.")
        d = dict(kind="filler", name=None, facts={}, order=[], extra=" ".join(sents))
        self.docs.append(d)
        return d

    def render(self, d):
        if d["kind"] == "filler":
            return d["extra"] + "\n"
        kind = "a country" if d["kind"] == "country" else "a person"
        head = f"Document about {d['name']}, {kind}."
        table = COUNTRY_ATTRS if d["kind"] == "country" else PERSON_ATTRS
        sents = [head]
        for a in d["order"]:
            t = table[a][0][0] if self.rng.random() < FIRST_PHRASING else table[a][0][1]
            sents.append(t.format(e=d["name"], v=d["facts"][a]))
        return " ".join(sents) + "\n"

    def distractors(self):
        while len(self.docs) < self.n_docs:
            r = self.rng.random()
            if r < 0.5:
                self.country()
            elif r < 0.85:
                self.person()
            else:
                self.filler()


def ask(world, qtype):
    """Add the gold documents for one question; returns (question, answer, gold docs)."""
    rng = world.rng
    if qtype == "country_attr":
        attr = rng.choice(list(COUNTRY_ATTRS))
        d = world.country(need=[attr])
        return qa_text(COUNTRY_ATTRS[attr][1], COUNTRY_CLOZE[attr], e=d["name"]), d["facts"][attr], [d]
    if qtype == "person_attr":
        attr = rng.choice(list(PERSON_ATTRS))
        d = world.person(need=[attr])
        return qa_text(PERSON_ATTRS[attr][1], PERSON_CLOZE[attr], e=d["name"]), d["facts"][attr], [d]
    if qtype == "reverse":
        d = world.country(need=["capital"])
        return qa_text(REVERSE_Q, REVERSE_CLOZE, v=d["facts"]["capital"]), d["name"], [d]
    if qtype == "twohop_doc":
        attr = rng.choice(list(TWOHOP_DOC_Q))
        d = world.country(need=["capital", attr])
        return qa_text(TWOHOP_DOC_Q[attr], TWOHOP_DOC_CLOZE[attr], v=d["facts"]["capital"]), d["facts"][attr], [d]
    if qtype == "twohop_xdoc":
        attr = rng.choice(list(TWOHOP_XDOC_Q))
        p = world.person(need=[attr])
        d = world.country(need=["leader"], leader=p["name"])
        return qa_text(TWOHOP_XDOC_Q[attr], TWOHOP_XDOC_CLOZE[attr], e=d["name"]), p["facts"][attr], [d, p]
    raise KeyError(qtype)


def ask_existing(world):
    """A question about a document already in the world (training only:
    extra questions per prompt). Returns (qtype, question, answer, gold docs)."""
    rng = world.rng
    docs = [d for d in world.docs if d["kind"] != "filler" and d["facts"]]
    d = rng.choice(docs)
    if d["kind"] == "person":
        attr = rng.choice(d["order"])
        return "person_attr", qa_text(PERSON_ATTRS[attr][1], PERSON_CLOZE[attr], e=d["name"]), d["facts"][attr], [d]
    f = d["facts"]
    opts = [("country_attr", a) for a in f]
    if "capital" in f:
        opts.append(("reverse", None))
        opts += [("twohop_doc", a) for a in TWOHOP_DOC_Q if a in f]
    people = {p["name"]: p for p in world.docs if p["kind"] == "person"}
    if "leader" in f and f["leader"] in people:
        p = people[f["leader"]]
        opts += [("twohop_xdoc", a) for a in TWOHOP_XDOC_Q if a in p["facts"]]
    qt, a = rng.choice(opts)
    if qt == "country_attr":
        return qt, qa_text(COUNTRY_ATTRS[a][1], COUNTRY_CLOZE[a], e=d["name"]), f[a], [d]
    if qt == "reverse":
        return qt, qa_text(REVERSE_Q, REVERSE_CLOZE, v=f["capital"]), d["name"], [d]
    if qt == "twohop_doc":
        return qt, qa_text(TWOHOP_DOC_Q[a], TWOHOP_DOC_CLOZE[a], v=f["capital"]), f[a], [d]
    p = people[f["leader"]]
    return qt, qa_text(TWOHOP_XDOC_Q[a], TWOHOP_XDOC_CLOZE[a], e=d["name"]), p["facts"][a], [d, p]


def pick_qtype(rng, allowed=None):
    items = [(q, w) for q, w in QTYPE_WEIGHTS.items() if allowed is None or q in allowed]
    return rng.choices([q for q, _ in items], weights=[w for _, w in items])[0]


def make_example(rng, stage=FINAL_STAGE, n_questions=1, n_docs=None):
    """One prompt world with n_questions questions about it.

    Returns dict(segments=[system, doc..., ] (no question), qas=[(question
    segment, answer text, qtype, hops, gold doc indexes)], n_docs, max_attrs).
    With n_questions > 1 (training only) the questions share the documents:
    up to (n_docs + 1) // 2 of them get their own gold documents, the rest
    ask about documents already there (ask_existing).
    """
    w = World(rng, stage, n_docs)
    n_q = max(1, min(n_questions, (w.n_docs + 1) // 2))
    asked = []
    for _ in range(n_q):
        room = w.n_docs - len(w.docs)
        qt = pick_qtype(rng, None if room >= 2 else [q for q in QTYPE_WEIGHTS if q != "twohop_xdoc"])
        if room < 1:
            break
        asked.append((qt,) + ask(w, qt))
    w.distractors()
    seen = {q for _, q, _, _ in asked}
    for _ in range(4 * n_questions):
        if len(asked) >= n_questions:
            break
        qt, q, a, gold = ask_existing(w)
        if q not in seen:
            seen.add(q)
            asked.append((qt, q, a, gold))
    order = list(range(len(w.docs)))
    rng.shuffle(order)
    pos = {id(w.docs[j]): i for i, j in enumerate(order)}
    texts = [w.render(w.docs[j]) for j in order]
    qas = []
    for qt, q, a, gold in asked:
        hops = 2 if qt == "twohop_xdoc" else 1
        qas.append((f"Question: {q}", a, qt, hops, sorted(pos[id(g)] for g in gold)))
    return dict(segments=[SYSTEM] + texts, qas=qas, n_docs=len(texts), max_attrs=w.max_attrs)


def to_record(ex, split, idx, qa_index=0):
    q, a, qt, hops, gold = ex["qas"][qa_index]
    segs = ex["segments"] + [q]
    return {
        "id": f"{split}-{idx}",
        "split": split,
        "prompt": SEP.join(segs),
        "segments": segs,
        "answer": a,
        "qtype": qt,
        "hops": hops,
        "n_docs": ex["n_docs"],
        "gold_docs": gold,
        "max_attrs": ex["max_attrs"],
    }


# split seeds are derived from the base seed so splits never share a stream
SPLIT_OFFSETS = {"train": 0, "val": 1_000_003, "test": 2_000_029}


def generate(split, n, seed, stage=FINAL_STAGE, n_docs_cycle=True):
    """n single-question records of the final distribution. With n_docs_cycle,
    val/test cycle n_docs over 2..16 so every count is equally represented."""
    rng = random.Random(seed + SPLIT_OFFSETS[split])
    lo, hi, _ = STAGES[stage]
    out = []
    for i in range(n):
        nd = lo + i % (hi - lo + 1) if n_docs_cycle else None
        out.append(to_record(make_example(rng, stage, 1, nd), split, i))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for train/val/test .jsonl")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--val", type=int, default=1000)
    p.add_argument("--test", type=int, default=1000)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for split, n in (("train", args.train), ("val", args.val), ("test", args.test)):
        recs = generate(split, n, args.seed, n_docs_cycle=split != "train")
        path = os.path.join(args.out, f"{split}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{path}: {n} records")


if __name__ == "__main__":
    main()
