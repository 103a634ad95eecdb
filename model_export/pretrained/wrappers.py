"""The forms an article arrives in, for fitting the classifier head, its calibration and its ood statistics.

A user posts a saved web page, an e-mail, a JSON record, a Markdown file, a headline alone, a first
paragraph, or the article with a table of figures after it. The served model must answer each as it answers
the article, and call each in distribution (issue 53: ood_score measures content, not wrapping). Each form is
a deterministic function of (text, seed); the seeds make the made-up parts (names, dates, figures) vary.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

Form = Callable[[str, str, list[str], random.Random], str]  # (text, title, body paragraphs, rng) -> text
FORMS: dict[str, Form] = {}


def _form(name: str) -> Callable[[Form], Form]:
    def register(fn: Form) -> Form:
        FORMS[name] = fn
        return fn

    return register


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.strip().split("\n") if p.strip()]


@_form("whole")
def whole(text: str, title: str, body: list[str], rng: random.Random) -> str:
    return text


@_form("headline")
def headline(text: str, title: str, body: list[str], rng: random.Random) -> str:
    return title or text


@_form("lead")
def lead(text: str, title: str, body: list[str], rng: random.Random) -> str:
    """The first sentence of the body (the lead), or the headline when there is no body."""
    if not body:
        return title or text
    return re.split(r"(?<=[.!?])\s+", body[0], maxsplit=1)[0]


@_form("web_page")
def web_page(text: str, title: str, body: list[str], rng: random.Random) -> str:
    section = rng.choice(["news", "world", "latest", "stories", "home"])
    links = "".join(f'<li><a href="/{w}">{w.title()}</a></li>' for w in rng.sample(["home", "video", "live", "local",
                    "weather", "opinion", "newsletters", "podcasts", "about", "contact"], 6))  # fmt: skip
    paras = "\n".join(f"<p>{p}</p>" for p in body)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title} | {section.title()}</title>"
        f"<link rel='stylesheet' href='/static/site.{rng.randrange(10**6):06d}.css'></head><body>"
        f"<header><nav><ul>{links}</ul></nav></header>\n<article><h1>{title}</h1>\n{paras}\n</article>\n"
        f"<footer><p>&copy; {rng.randint(2001, 2026)} All rights reserved. <a href='/privacy'>Privacy</a> "
        f"<a href='/cookies'>Cookies</a></p></footer></body></html>"
    )


@_form("email")
def email(text: str, title: str, body: list[str], rng: random.Random) -> str:
    who = rng.choice(["sam", "alex", "jo", "kim", "lee", "pat", "robin", "chris"])
    quoted = "\n".join("> " + p for p in body)
    return (
        f"From: {who}@example.org\nTo: team@example.org\nDate: {rng.randint(1, 28)} Mar {rng.randint(2001, 2026)} "
        f"{rng.randint(7, 19):02d}:{rng.randint(0, 59):02d}\nSubject: Fwd: {title}\n\nThought you would want to "
        f"see this.\n\n---------- Forwarded message ----------\n{title}\n\n{quoted}\n\n-- \n{who.title()}\n"
    )


@_form("json_record")
def json_record(text: str, title: str, body: list[str], rng: random.Random) -> str:
    record = {
        "id": rng.randrange(10**9),
        "title": title,
        "published": f"{rng.randint(2001, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "body": "\n\n".join(body),
        "lang": "en",
    }
    return json.dumps(record, indent=rng.choice([None, 2]))


@_form("markdown")
def markdown(text: str, title: str, body: list[str], rng: random.Random) -> str:
    return f"# {title}\n\n" + "\n\n".join(body) + "\n"


@_form("with_table")
def with_table(text: str, title: str, body: list[str], rng: random.Random) -> str:
    """The article, then a Markdown table of made-up figures (rows of region, period, count and change)."""
    rows = ["| region | period | count | change |", "| --- | --- | --- | --- |"]
    for _ in range(rng.randint(8, 25)):
        rows.append(f"| {rng.choice('ABCDEFGH')}{rng.randint(1, 99)} | {rng.randint(2001, 2026)}/{rng.randint(1, 4)} "
                    f"| {rng.randint(10, 99999)} | {rng.uniform(-20, 20):+.1f}% |")  # fmt: skip
    return text.rstrip() + "\n\n" + "\n".join(rows) + "\n"


def wrapped(text: str, form: str, seed: int) -> str:
    """`text` in one of FORMS (its first paragraph is the title); an unknown form is an error naming the
    allowed ones. The seed draws the made-up parts."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; allowed: {', '.join(FORMS)}")
    paras = paragraphs(text)
    return FORMS[form](text, paras[0] if paras else "", paras[1:], random.Random(seed))
