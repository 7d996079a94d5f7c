"""URL blocklists, with the rules of datatrove's URLFilter: blocked domains (and their subdomains), exact URLs,
banned URL words, soft-banned words (at least `soft_word_threshold` of them) and banned substrings of the
normalised URL. The lists come from files the user names (nothing is downloaded); each drop says which rule and
which list entry matched, so the dropped-document samples show what every list removed.

Differs from datatrove on purpose: the host is read with the standard library instead of tldextract (no public
suffix list to fetch), and a listed domain blocks every subdomain of it at any depth (datatrove: the registered
domain or the exact host); URL words are compared lowercased (datatrove: as written, so "Casino" passes); blank
lines in a list are skipped (datatrove would ban the empty word, i.e. every URL).
"""

from __future__ import annotations

import re
from collections import Counter
from urllib.parse import urlsplit

from core.document import Document
from core.paths import expand_placeholders

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")


def normalize(text: str) -> str:
    return _NON_ALNUM.sub("", text).lower()


def read_list(paths: list[str], normalise: bool) -> frozenset[str]:
    out: set[str] = set()
    for raw in paths:
        with open(expand_placeholders(raw), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("#") or not line.strip():
                    continue
                out.add(normalize(line) if normalise else line.strip().lower())
    return frozenset(out - {""})


class URLFilter:
    name = "url"

    def __init__(
        self,
        blocked_domains: list[str] = (),
        blocked_urls: list[str] = (),
        banned_words: list[str] = (),
        soft_banned_words: list[str] = (),
        soft_word_threshold: int = 2,
        banned_subwords: list[str] = (),
    ):
        self.domains = read_list(list(blocked_domains), normalise=False)
        self.urls = frozenset(u for u in read_list(list(blocked_urls), normalise=False))
        self.words = read_list(list(banned_words), normalise=True)
        self.soft_words = read_list(list(soft_banned_words), normalise=True)
        self.soft_word_threshold = soft_word_threshold
        self.subwords = read_list(list(banned_subwords), normalise=True)
        # one alternation for all substrings: the regex engine scans the URL once (datatrove: Aho-Corasick)
        self._subword_re = (
            re.compile("|".join(map(re.escape, sorted(self.subwords, key=len, reverse=True))))
            if self.subwords
            else None
        )
        self.stats: Counter = Counter()

    def empty(self) -> bool:
        return not (self.domains or self.urls or self.words or self.soft_words or self.subwords)

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, str]:
        url = doc.url
        if not url:
            self.stats["no_url"] += 1  # nothing to check: kept, and counted so a URL-less source is visible
            return True, None
        if self.domains:
            host = (urlsplit(url if "//" in url else "//" + url).hostname or "").rstrip(".")
            parts = host.split(".")
            for i in range(len(parts) - 1):
                dom = ".".join(parts[i:])
                if dom in self.domains:
                    return False, ("url:domain" if dom.count(".") <= 1 else "url:subdomain"), dom
        if self.urls and url.strip().lower() in self.urls:
            return False, "url:url", url.strip().lower()
        if self.words or self.soft_words:
            words = set(_NON_ALNUM.split(url.lower()))
            hit = self.words.intersection(words)
            if hit:
                return False, "url:banned_word", sorted(hit)[0]
            soft = self.soft_words.intersection(words)
            if len(soft) >= self.soft_word_threshold:
                return False, "url:soft_banned_words", sorted(soft)
        if self._subword_re is not None:
            m = self._subword_re.search(normalize(url))
            if m:
                return False, "url:banned_subword", m.group(0)
        return True, None


def url_filter(**settings) -> URLFilter | None:
    """The filter, or None (not run) when no list is configured."""
    f = URLFilter(**settings)
    return None if f.empty() else f
