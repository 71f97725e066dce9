"""The corpus is deterministic and has the length mix and non-ASCII share it promises."""

from __future__ import annotations

from loadtest.corpus import CorpusSpec, make_corpus


def test_same_seed_same_corpus_other_seed_other_corpus() -> None:
    assert make_corpus(CorpusSpec(size=200, seed=7)) == make_corpus(CorpusSpec(size=200, seed=7))
    assert make_corpus(CorpusSpec(size=200, seed=7)) != make_corpus(CorpusSpec(size=200, seed=8))


def test_length_mix_spans_queries_to_full_passages_with_non_ascii() -> None:
    texts = make_corpus(CorpusSpec(size=2000))
    words = sorted(len(t.split()) for t in texts)
    assert words[0] <= 3 and words[len(words) // 2] <= 30, "mostly short texts"
    assert sum(w >= 400 for w in words) >= 20, "a tail of passages that fill a 512-token window"
    share = sum(any(ord(c) > 127 for c in t) for t in texts) / len(texts)
    assert 0.10 < share < 0.25
    assert any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts), "CJK present"
