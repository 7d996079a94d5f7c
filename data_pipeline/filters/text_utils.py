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

# datatrove's TERMINAL_PUNCTUATION (utils/text.py): the characters that end a line "in punctuation" for FineWeb.
TERMINAL_PUNCTUATION = frozenset(
    "!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965"
    "\u104a\u104b\u1362\u1367\u1368\u166e\u1735\u1736\u17d4\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944"
    "\u1945\u1aa8\u1aa9\u1aaa\u1aab\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u203c"
    "\u203d\u2047\u2048\u2049\u2e2e\u2e3c\u2e53\u2e54\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877"
    "\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0\uaaf1\uabeb\ufe52\ufe56\ufe57\uff01\uff0e"
    "\uff1f\uff61\U00010a56\U00010a57\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86"
    "\U00010f87\U00010f88\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1"
    "\U00011141\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238"
    "\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9"
    "\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2"
    "\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7\U00011641\U00011642\U0001173c\U0001173d"
    "\U0001173e\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42"
    "\U00011ef7\U00011ef8\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38"
    "\U00016b44\U00016e98\U0001bc9f\U0001da88"
)

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
