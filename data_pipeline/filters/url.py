"""URL blocklists, with the rules of datatrove's URLFilter: blocked domains (and their subdomains), exact URLs,
banned URL words, soft-banned words (at least `soft_word_threshold` of them) and banned substrings of the
normalised URL. The lists come from files the user names (nothing is downloaded); each drop says which rule and
which list entry matched, so the dropped-document samples show what every list removed.

Differs from datatrove on purpose: the host is read with the standard library instead of tldextract (no public
suffix list to fetch), and a listed domain blocks every subdomain of it at any depth (datatrove: the registered
domain or the exact host); URL words are compared lowercased (datatrove: as written, so "Casino" passes); blank
lines in a list are skipped (datatrove would ban the empty word, i.e. every URL).

How a list file is read (runconfig/blocklist.py, the same rules the config's loader checks the files with): a
domain entry may be written as a URL without a path, `*.bad.example` / `.bad.example` (read as the domain, which
blocks itself and its subdomains), with a trailing dot or a port, as a hosts-file or adblock `||domain^` line, and
in unicode or punycode (both sides are compared in punycode, case folded); a URL entry with or without its scheme.
An entry that could never match (a path in a domain list, a wildcard elsewhere, two words in a word list) and a
binary file are refused, naming the file, the line and the entry.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field

from core.document import Document
from runconfig.blocklist import LIST_KINDS, BlocklistFiles, host_key, normalize_words, read_blocklist, url_key

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")
normalize = normalize_words  # datatrove's URL normaliser, under the name this module has exported


def read_list(paths: list[str], kind: str) -> dict[str, str]:
    """{compared key: entry as written} over the files of one list kind, read by runconfig/blocklist.py's rules."""
    out: dict[str, str] = {}
    for raw in paths:
        out.update(read_blocklist(raw, kind))
    return out


class URLFilter:
    """Blocklists (files, one entry a line, `#` comments) checked against each document's URL, with datatrove's
    URLFilter rules. With no list given there is nothing to check and the filter does not run. Which forms of an
    entry are read (URLs, wildcards, hosts-file lines, IDN either way) and which refused: runconfig/blocklist.py."""

    name = "url"

    def __init__(
        self,
        blocked_domains: BlocklistFiles = (),  # a listed domain blocks itself and every subdomain of it
        blocked_urls: BlocklistFiles = (),  # exact URLs, with or without the scheme (a trailing / ignored)
        banned_words: BlocklistFiles = (),  # a word of the URL (split on non-alphanumerics) on the list
        soft_banned_words: BlocklistFiles = (),  # at least soft_word_threshold of these words in the URL
        soft_word_threshold: Annotated[int, Field(ge=1)] = 2,
        banned_subwords: BlocklistFiles = (),  # a substring of the URL with non-alphanumerics removed, lowercased
    ):
        self.domains = frozenset(read_list(list(blocked_domains), "blocked_domains"))
        self.urls = read_list(list(blocked_urls), "blocked_urls")  # key -> the entry as written, for the drop
        self.words = frozenset(read_list(list(banned_words), "banned_words"))
        self.soft_words = frozenset(read_list(list(soft_banned_words), "soft_banned_words"))
        self.soft_word_threshold = soft_word_threshold
        self.subwords = frozenset(read_list(list(banned_subwords), "banned_subwords"))
        # one alternation for all substrings: the regex engine scans the URL once (datatrove: Aho-Corasick)
        self._subword_re = (
            re.compile("|".join(map(re.escape, sorted(self.subwords, key=len, reverse=True))))
            if self.subwords
            else None
        )
        self.stats: Counter = Counter()

    @staticmethod
    def active(settings: Any) -> bool:
        """Whether a section's settings give the filter anything to check (at least one list)."""
        return any(getattr(settings, kind) for kind in LIST_KINDS)

    def empty(self) -> bool:
        """Nothing to check (no list given): the chain leaves the step out."""
        return not (self.domains or self.urls or self.words or self.soft_words or self.subwords)

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, str]:
        url = doc.url
        if not url:
            self.stats["no_url"] += 1  # nothing to check: kept, and counted so a URL-less source is visible
            return True, None
        if self.domains:
            try:
                raw_host = urlsplit(url if "//" in url else "//" + url).hostname or ""
            except ValueError:  # an unparseable URL (a bad IPv6 literal): no host to check
                raw_host = ""
            host = host_key(raw_host) or raw_host.rstrip(".")
            parts = host.split(".")
            for i in range(len(parts)):
                dom = ".".join(parts[i:])
                if dom in self.domains:
                    return False, ("url:domain" if dom.count(".") <= 1 else "url:subdomain"), dom
        if self.urls:
            key = url_key(url)
            if key is not None and key in self.urls:
                return False, "url:url", self.urls[key]
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
