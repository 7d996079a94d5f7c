"""Word and sentence splitting for the quality rules, regex-only.

The reference implementation (datatrove) tokenises every document, and every kept line again, with spaCy's
English tokenizer + sentencizer; that dominates its filter time. These regexes reproduce spaCy's splits on
ordinary prose (punctuation split off as its own token, abbreviations kept whole, contractions split) so
the rule thresholds mean the same thing, at a fraction of the cost. Known differences, all rare in
prose: "Hello.World" stays one token, "A$" is two.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

# spaCy's English tokenizer exceptions that end in "." (kept as one token, never a sentence end).
_ABBREV = (
    "Adm Ak Ala Apr Ariz Ark Aug Bros Calif Co Colo Conn Corp Dec Del Dr Feb Fla Ga Gen Gov Ia Id Ill Inc Ind "
    "Jan Jr Jul Jun Kan Kans Ky La Ltd Mar Mass Md Messrs Mich Minn Miss Mo Mont Mr Mrs Ms Mt Neb Nebr Nev Nov "
    "Oct Okla Ore Pa Prof Rep Rev Sen Sep Sept St Tenn Va Wash Wis co vs a b c d e f g h i j k l m n o p q r s "
    "t u v w x y z"
).split()
_ABBREV_RE = "|".join(sorted((re.escape(a) + r"\." for a in _ABBREV), key=len, reverse=True))
_L = r"[^\W\d_]"  # a letter, in the stdlib `re` (which is ~3x faster than `regex` here)
# spaCy splits these off a number as their own token ("600m" -> "600", "m"; "5km" -> "5", "km").
_UNITS = (
    "km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz m/s km/h kmh "
    "mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K"
).split()
_UNIT_RE = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
WORD_RE = re.compile(
    rf"""
      (?<!\w)(?=\w\.\w\.)(?:{_L}\.){{2,}}(?!{_L})                     # U.S.  e.g.  D.C.
    | (?<!{_L})(?=\w{{1,7}}\.)(?:{_ABBREV_RE})(?!\w)                    # Mr.  Inc.  vs.  (600)m.
    | (?<!\w)\d+(?:[.,]\d+)*(?=(?:{_UNIT_RE})(?!\w))                    # 600 | m
    | (?<!\w)[Cc]an(?=not(?!\w))                                        # can | not
    | (?<!\w){_L}+(?=n['’]t(?!\w))                                      # do | n't
    | n['’]t(?!\w)
    | \w+(?:(?:[.@&]|(?<=\d)[,/](?=\d)|(?<={_L})-(?=\d)
               |['’](?!(?:[sSdDmMtT]|re|RE|ve|VE|ll|LL)(?!\w)))\w+)*   # words, 1.13bn, 10,000, S&P
    | ['’](?:[sSdDmM]|re|RE|ve|VE|ll|LL|t|T)(?!\w)                        # 's 're 'll (split like spaCy)
    | \.{{2,}} | -{{2,}}                                                # ellipsis / dashes: one token
    | [^\s\w]                                                          # any other symbol: its own token
    """,
    re.X,
)

# spaCy sentencizer's default sentence-final characters (the common ones).
SENT_END = frozenset("!.?։؟۔܀܁܂߹।॥၊။።፧፨᙮᜵᜶᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？𐩖𐩗。｡")

# datatrove's PUNCTUATION (utils/text.py), copied so "symbol-only word" means the same in both.
PUNCTUATION = (
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    + "".join(map(chr, (x for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b))))
)
PUNCTUATION_SET = frozenset(PUNCTUATION) | frozenset("᪩？⁈𑩂．꩞𑅃﹗𑂾\u1b7d፧‽᪫﹖𑑌𑈼𑗐៙᰻")


@lru_cache(maxsize=8)
def _split_cached(text: str) -> tuple[str, ...]:
    return tuple(WORD_RE.findall(text))


def split_words(text: str) -> list[str]:
    """Tokens of a text; whole documents are cached because the repetition and quality rules both need them."""
    if len(text) > 256:
        return list(_split_cached(text))
    return WORD_RE.findall(text)


@lru_cache(maxsize=4096)
def _is_punct(tok: str) -> bool:
    return all(unicodedata.category(c).startswith("P") for c in tok)


def count_sentences(tokens: list[str]) -> int:
    """spaCy sentencizer's rule: a new sentence starts at the first non-punctuation token after an
    end character token."""
    if not tokens:
        return 0
    n, seen = 1, False
    for t in tokens:
        if t in SENT_END:
            seen = True
        elif seen and not _is_punct(t):
            n += 1
            seen = False
    return n
