"""Circuit tasks built offline from templates: IOI, induction, capital-city recall.

A :class:`CircuitTask` is a batch of clean prompts of one length, the corrupted prompts
that activation patching reads from, the query positions where the metric is read, the
answer (and foil) token at each query, and the one key per query that the task's heads
are expected to read (the induction key, the indirect-object name, the country).

Metric: ``logit[answer] - logit[foil]`` at each query, or ``logit[answer] - mean logit``
where there is no foil (induction), averaged over queries.
"""

import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from cwlens.circuits.direct_math import logit_difference
from cwlens.engine import validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InputTooLongError, InvalidArgumentError, UnknownOptionError


class TaskBuildError(UnknownOptionError):
    """The templates do not give single-token answers or equal-length prompts here."""


@dataclass(frozen=True)
class CircuitTask:
    """Tokens and positions of one task. Shapes: ``clean``/``corrupted`` ``[batch, pos]``;
    ``answers``, ``foils`` (or None), ``keys``: ``[batch, n_queries]``."""

    name: str
    description: str
    clean: torch.Tensor
    corrupted: torch.Tensor
    queries: tuple[int, ...]
    answers: torch.Tensor
    foils: torch.Tensor | None
    keys: torch.Tensor
    key_description: str

    def metric(self, logits: torch.Tensor) -> torch.Tensor:
        """The task's logit difference per prompt, ``[batch]``, averaged over queries."""
        q = torch.as_tensor(self.queries)
        n = logits.shape[0] // self.answers.shape[0]  # a batch repeated n times (patching)
        answers = self.answers.to(logits.device).repeat(n, 1)
        foils = None if self.foils is None else self.foils.to(logits.device).repeat(n, 1)
        return logit_difference(logits, q, answers, foils).mean(-1)

    @property
    def n_prompts(self) -> int:
        return int(self.clean.shape[0])

    def subset(self, rows: Sequence[int]) -> "CircuitTask":
        """The same task on prompts ``rows`` only (e.g. to resample the prompts)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        if index.numel() == 0:
            raise InvalidArgumentError("subset needs at least one prompt index.")
        if int(index.min()) < 0 or int(index.max()) >= self.n_prompts:
            raise InvalidArgumentError(f"subset rows must be in 0..{self.n_prompts - 1}; got {list(rows)}.")

        return replace(self, clean=self.clean[index], corrupted=self.corrupted[index],
                       answers=self.answers[index], keys=self.keys[index],
                       foils=None if self.foils is None else self.foils[index])


def _tokens(handle: ModelHandle, text: str) -> list[int]:
    return handle.to_tokens(text)[0].tolist()


def _answer_token(handle: ModelHandle, prompt: list[int], text: str, answer: str) -> int | None:
    """The single token ``answer`` adds after ``text``, or None if it is not one token."""
    full = _tokens(handle, text + answer)
    if len(full) != len(prompt) + 1 or full[: len(prompt)] != prompt:
        return None
    return full[-1]


def _keep_common_length(rows: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    if not rows:
        raise TaskBuildError(
            f"{what}: no prompt has single-token answers with this tokenizer; pass other "
            "words, each one token after a space (Python: ioi_task(names=, places=, "
            "objects=), capitals_task(pairs=)). The CLI uses the built-in lists: with this "
            "model, use --task induction (random tokens, any tokenizer)."
        )
    length = Counter(len(r["clean"]) for r in rows).most_common(1)[0][0]
    kept = [r for r in rows if len(r["clean"]) == length and len(r["corrupted"]) == length]
    if len(kept) < 2:
        raise TaskBuildError(
            f"{what}: fewer than 2 prompts share one token length ({length}); pass words "
            "that tokenize to the same number of tokens."
        )
    return kept


def _position(tokens: list[int], token: int, occurrence: int = 0) -> int:
    return [i for i, t in enumerate(tokens) if t == token][occurrence]


def _seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidArgumentError(f"seed must be an integer >= 0; got {seed!r}.")
    return seed


def _words(value: object, name: str, at_least: int = 1) -> list[str]:
    """A list of non-blank strings, each once, at least ``at_least`` of them."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{name} must be a list of words, e.g. ['Mary', 'John']; got {value!r}.")
    words = list(value)
    if not all(isinstance(w, str) and w.strip() for w in words):
        raise InvalidArgumentError(f"{name} must hold non-empty strings; got {value!r}.")
    if len(set(words)) != len(words):
        raise InvalidArgumentError(f"{name} lists a word twice: {value!r}; give each once.")
    if len(words) < at_least:
        raise InvalidArgumentError(f"{name} needs at least {at_least} words; got {len(words)}.")
    return words


def _fits(handle: ModelHandle, length: int, what: str, fix: str) -> None:
    limit = handle.context_length()
    if limit is not None and length > limit:
        raise InputTooLongError(f"{what}: the prompts would have {length} tokens, more than the "
                                f"model's context of {limit} (n_ctx); {fix}.")


NAMES = ("Mary", "John", "Tom", "James", "Anna", "Sarah", "David", "Emma", "Paul", "Lisa")
PLACES = ("store", "park", "school", "beach", "office", "garden")
OBJECTS = ("drink", "book", "ball", "gift", "key", "letter")


IOI_CORRUPTIONS = ("abc", "swap")


@takes_model
def ioi(
    model: ModelLike,
    n_prompts: int = 8,
    names: Sequence[str] = NAMES,
    places: Sequence[str] = PLACES,
    objects: Sequence[str] = OBJECTS,
    seed: int = 0,
    corruption: str = "abc",
) -> CircuitTask:
    """Indirect object identification (Wang et al., 2022).

    Clean: "When {A} and {B} went to the {place}, {B} gave a {object} to" -> " {A}" (foil
    " {B}"). Query: the last position; key: the first {A} (what name-mover heads copy).
    Corrupted (``corruption``):

    ``"abc"`` (default, Wang et al.'s p_ABC): the same sentence with three distinct random
        names "When {C} and {D} went to the {place}, {E} gave a {object} to", drawn
        independently of A and B. It keeps the template and removes the information
        the task needs (which name is repeated), so patching a head from it removes what
        that head carries about IO and S.
    ``"swap"``: the second {B} becomes {A}, so the answer flips to {B} (a stronger
        counterfactual: the corrupted prompt asks for the foil).
    """
    validation.positive_int(n_prompts, "n_prompts")
    if n_prompts < 2:
        raise InvalidArgumentError("n_prompts (CLI: --prompts) must be at least 2 for ioi (prompts of one token "
                                   "length are kept, and patching needs a batch); got 1.")
    names, places, objects = _words(names, "names", 2), _words(places, "places"), _words(objects, "objects")
    if corruption not in IOI_CORRUPTIONS:
        raise UnknownOptionError(
            f"Unknown corruption={corruption!r}. Valid: 'abc' (Wang et al.'s three random "
            "names, the default) or 'swap' (the second subject becomes the indirect object)."
        )
    if corruption == "abc" and len(set(names)) < 3:
        raise TaskBuildError(f"IOI with corruption='abc' needs at least 3 distinct names; got {list(names)}.")
    g = torch.Generator().manual_seed(_seed(seed))
    g_abc = torch.Generator().manual_seed(seed + 1)  # its own stream: same clean prompts either way
    rows: list[dict[str, Any]] = []
    for _ in range(n_prompts * 4):
        if len(rows) >= n_prompts:
            break
        a, b = (names[int(i)] for i in torch.randperm(len(names), generator=g)[:2])
        place = places[int(torch.randint(len(places), (1,), generator=g))]
        obj = objects[int(torch.randint(len(objects), (1,), generator=g))]
        c, d, e = (names[int(i)] for i in torch.randperm(len(names), generator=g_abc)[:3]) \
            if corruption == "abc" else (a, b, a)

        def text(n1, n2, s2, place=place, obj=obj):
            return f"When {n1} and {n2} went to the {place}, {s2} gave a {obj} to"

        clean_t, corr_t = text(a, b, b), text(c, d, e)
        clean, corr = _tokens(model, clean_t), _tokens(model, corr_t)
        ans, foil = _answer_token(model, clean, clean_t, f" {a}"), _answer_token(model, clean, clean_t, f" {b}")
        if ans is None or foil is None or ans == foil:
            continue
        rows.append({"clean": clean, "corrupted": corr, "answer": ans, "foil": foil,
                     "key": _position(clean, ans)})
    rows = _keep_common_length(rows, "IOI")
    n = len(rows[0]["clean"])
    return CircuitTask(
        "ioi", f"indirect object identification: logit(IO) - logit(S) at the last token "
        f"(corruption: {corruption})",
        torch.tensor([r["clean"] for r in rows]), torch.tensor([r["corrupted"] for r in rows]),
        (n - 1,), torch.tensor([[r["answer"]] for r in rows]), torch.tensor([[r["foil"]] for r in rows]),
        torch.tensor([[r["key"]] for r in rows]), "the indirect object's first mention",
    )


@takes_model
def induction(model: ModelLike, n_prompts: int = 4, length: int = 20, seed: int = 0) -> CircuitTask:
    """Repeated random tokens: ``BOS R R`` (clean) vs ``BOS R' R`` (corrupted: nothing to copy).

    Queries: every position of the second copy that predicts a repeated token; answer:
    that next token (foil: the mean logit); key: the token after the query token's first
    occurrence (the induction key, query - length + 1).
    """
    validation.positive_int(n_prompts, "n_prompts")
    validation.positive_int(length, "length")
    if length < 2:
        raise InvalidArgumentError("length (CLI: --length) must be at least 2: the second copy needs a query "
                                   "that predicts a repeated token; got 1.")
    _fits(model, 2 * length + 1, f"induction length={length}", "pass a smaller length "
          "(at most (n_ctx - 1) // 2)")
    g = torch.Generator().manual_seed(_seed(seed))
    vocab = model.d_vocab
    low, high = min(1000, vocab // 10), min(20000, vocab)
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    bos = torch.full((n_prompts, 1), bos_id if bos_id is not None else low, dtype=torch.long)
    rand = torch.randint(low, high, (n_prompts, length), generator=g)
    other = torch.randint(low, high, (n_prompts, length), generator=g)
    clean = torch.cat([bos, rand, rand], 1)
    corrupted = torch.cat([bos, other, rand], 1)
    queries = tuple(range(length + 1, 2 * length))
    q = torch.tensor(queries)
    answers = clean[:, q + 1]
    keys = (q - length + 1).expand(n_prompts, -1).clone()
    return CircuitTask(
        "induction", "induction on repeated random tokens: logit(next token) - mean logit over the second copy",
        clean, corrupted, queries, answers, None, keys, "the token after the previous occurrence",
    )


CAPITALS = (("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"),
            ("England", "London"), ("China", "Beijing"), ("Canada", "Ottawa"), ("Poland", "Warsaw"))


@takes_model
def capitals(model: ModelLike, pairs: Sequence[tuple[str, str]] = CAPITALS, template: str = "The capital of {} is") -> CircuitTask:
    """Fact recall: "The capital of {country} is" -> " {capital}", foil: the capital of
    the corrupted prompt's country (the next pair in the list). Query: the last position;
    key: the country token (the subject)."""
    if isinstance(pairs, str) or not isinstance(pairs, Sequence) or len(pairs) < 2 or not all(
            isinstance(p, tuple | list) and len(p) == 2 and all(isinstance(x, str) and x.strip() for x in p)
            for p in pairs):
        raise InvalidArgumentError(
            "pairs must be a list of at least 2 (country, capital) string pairs, e.g. "
            f"[('France', 'Paris'), ('Italy', 'Rome')]; got {pairs!r}.")
    if not isinstance(template, str) or template.count("{}") != 1:
        raise InvalidArgumentError(
            f"template must be a string with one {{}} for the country, e.g. 'The capital of {{}} "
            f"is'; got {template!r}.")
    rows: list[dict[str, Any]] = []
    for i, (country, capital) in enumerate(pairs):
        other_country, other_capital = pairs[(i + 1) % len(pairs)]
        clean_t, corr_t = template.format(country), template.format(other_country)
        clean, corr = _tokens(model, clean_t), _tokens(model, corr_t)
        ans = _answer_token(model, clean, clean_t, f" {capital}")
        foil = _answer_token(model, clean, clean_t, f" {other_capital}")
        country_tokens = _tokens(model, template.split("{}")[0] + country)
        if ans is None or foil is None or ans == foil or country_tokens != clean[: len(country_tokens)]:
            continue
        rows.append({"clean": clean, "corrupted": corr, "answer": ans, "foil": foil,
                     "key": len(country_tokens) - 1})
    rows = _keep_common_length(rows, "capitals")
    n = len(rows[0]["clean"])
    return CircuitTask(
        "capitals", "capital-city recall: logit(capital) - logit(other capital) at the last token",
        torch.tensor([r["clean"] for r in rows]), torch.tensor([r["corrupted"] for r in rows]),
        (n - 1,), torch.tensor([[r["answer"]] for r in rows]), torch.tensor([[r["foil"]] for r in rows]),
        torch.tensor([[r["key"]] for r in rows]), "the country (the subject's last token)",
    )


TASKS: dict[str, Callable[..., CircuitTask]] = {"ioi": ioi, "induction": induction, "capitals": capitals}


def build_task(name: str, model, **kwargs) -> CircuitTask:
    """One of :data:`TASKS` by name."""
    if not isinstance(name, str) or name not in TASKS:
        raise UnknownOptionError(f"Unknown task={name!r}. Valid tasks: {', '.join(map(repr, TASKS))}.")

    known = [p for p in inspect.signature(TASKS[name]).parameters if p != "model"]
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        raise InvalidArgumentError(f"task {name!r} takes no {', '.join(unknown)}; it takes "
                                   f"{', '.join(known)}.")
    return TASKS[name](model, **kwargs)
