"""A deterministic text corpus with a realistic length mix (short queries to 512-token passages).

Texts are generated from a seed, so every run, machine and tool sees the same inputs:
no data file to ship, no download. The mix is weighted towards short texts, like search
and classification traffic, with a long tail of passages that fill a 512-token window.
Roughly one text in six carries non-ASCII (accents, CJK, Cyrillic, emoji).
"""

from __future__ import annotations

import random

from pydantic import BaseModel, Field

WORDS = ["the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "by", "at", "from", "this", "be", "are", "was", "it", "an", "or", "not", "model", "server", "request", "latency", "throughput", "token", "batch", "queue", "graph", "tensor", "memory", "network", "client", "service", "search", "query", "answer", "document", "passage", "review", "product", "price", "delivery", "quality", "support", "account", "payment", "order", "refund", "shipping", "weather", "city", "music", "movie", "book", "travel", "hotel", "flight", "train", "station", "market", "energy", "climate", "policy", "health", "doctor", "patient", "research", "study", "result", "data", "analysis", "value", "growth", "report", "annual", "customer", "experience", "friendly", "helpful", "terrible", "excellent", "broken", "fast", "slow", "cheap", "expensive", "recommend", "again", "never", "always", "great", "poor", "average", "window", "screen", "battery"]

NON_ASCII = ["café", "naïve", "über", "straße", "résumé", "façade", "jalapeño", "smörgåsbord", "crème", "brûlée", "déjà", "東京", "北京", "機械学習", "推論", "服务器", "模型", "데이터", "검색", "Москва", "данные", "поиск", "сервер", "ελληνικά", "δεδομένα", "العربية", "بيانات", "🙂", "🚀", "✓", "€", "£", "¥", "—", "…", "«»", "“”"]


class LengthBand(BaseModel):
    """Texts of `min_words`..`max_words` words, drawn with relative `weight`."""

    name: str
    min_words: int = Field(ge=1)
    max_words: int = Field(ge=1)
    weight: float = Field(gt=0)


DEFAULT_MIX: tuple[LengthBand, ...] = (
    LengthBand(name="query", min_words=2, max_words=10, weight=0.45),
    LengthBand(name="sentence", min_words=11, max_words=40, weight=0.30),
    LengthBand(name="paragraph", min_words=41, max_words=150, weight=0.17),
    LengthBand(name="passage", min_words=151, max_words=520, weight=0.08),
)


class CorpusSpec(BaseModel):
    """How to generate a corpus: size, seed, length mix, share of texts with non-ASCII."""

    size: int = Field(2000, ge=1)
    seed: int = 1234
    non_ascii_share: float = Field(1 / 6, ge=0, le=1)
    mix: tuple[LengthBand, ...] = DEFAULT_MIX


def _text(rng: random.Random, words: int, non_ascii: bool) -> str:
    tokens = [rng.choice(WORDS) for _ in range(words)]
    if non_ascii:
        for _ in range(max(1, words // 8)):
            tokens[rng.randrange(words)] = rng.choice(NON_ASCII)
    out: list[str] = []
    for i, tok in enumerate(tokens):
        if i == 0 or out[-1].endswith("."):
            tok = tok[:1].upper() + tok[1:]
        out.append(tok)
        if words > 12 and rng.random() < 0.07:
            out[-1] += "."
    return " ".join(out) + ("?" if words <= 10 else ".")


def make_corpus(spec: CorpusSpec | None = None) -> list[str]:
    """Return `spec.size` texts, the same list for the same spec on every machine."""
    spec = spec or CorpusSpec()
    rng = random.Random(spec.seed)
    bands = list(spec.mix)
    weights = [b.weight for b in bands]
    texts = []
    for _ in range(spec.size):
        band = rng.choices(bands, weights)[0]
        words = rng.randint(band.min_words, band.max_words)
        texts.append(_text(rng, words, rng.random() < spec.non_ascii_share))
    return texts


def fixed_length_corpus(words: int | tuple[int, int], size: int = 256, seed: int = 1234) -> list[str]:
    """`size` ASCII texts of exactly `words` words (for model-alone comparisons at one length), or of a length drawn
    uniformly from a (min, max) range."""
    rng = random.Random(seed)
    low, high = (words, words) if isinstance(words, int) else words
    return [_text(rng, low if low == high else rng.randint(low, high), False) for _ in range(size)]
