"""The built-in cleaning filters' typed settings: the `data.clean.<section>` sections the config validates (a
`filters:` step's `params` override them), and the filters' default order. An outside filter brings its own
settings as the `settings` attribute of its factory (checked when the clean stage starts, before any work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from core.specs import Options
from runconfig.blocklist import LIST_KINDS, read_blocklist

# A filter's settings are a typed section (unknown keys rejected): the built-ins' live here, as data the config
# validates against (`data.clean.<section>` and a `filters:` step's `params`); an outside filter brings its own
# as the `settings` attribute of its factory (checked when the clean stage starts, before any work).


class UnicodeConfig(Options):
    enabled: bool = True
    fix_text: bool = True  # ftfy mojibake repair
    normalization: Literal["NFC", "NFKC", "none"] = "NFC"


class C4Config(Options):
    enabled: bool = True
    split_paragraph: bool = True
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    filter_bad_words: bool = False


class GopherQualityConfig(Options):
    enabled: bool = True
    min_doc_words: int = 50
    max_doc_words: int = 100_000
    min_avg_word_length: float = 3
    max_avg_word_length: float = 10
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    max_non_alpha_words_ratio: float = 0.8
    min_stop_words: int = 2


class GopherRepetitionConfig(Options):
    enabled: bool = True
    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: list[tuple[int, float]] = [(2, 0.2), (3, 0.18), (4, 0.16)]
    dup_n_grams: list[tuple[int, float]] = [(5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)]


class LangIdConfig(Options):
    enabled: bool = True
    languages: list[str] = ["en"]
    threshold: float = Field(0.65, ge=0, le=1)


class FineWebQualityConfig(Options):
    """datatrove's FineWebQualityFilter thresholds (the FineWeb recipe's). Off by default: on top of C4 and Gopher
    the duplicated-line rule alone removes a sizeable share of a crawl; switch it on for FineWeb's recipe."""

    enabled: bool = False
    line_punct_thr: float = Field(0.12, ge=0, le=1)
    line_punct_exclude_zero: bool = False
    short_line_thr: float = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    char_duplicates_ratio: float = Field(0.01, ge=0, le=1)
    new_line_ratio: float = Field(0.3, ge=0)


class UrlFilterConfig(Options):
    """Blocklists (files, one entry a line, `#` comments) checked against each document's URL, with datatrove's
    URLFilter rules. With no list given there is nothing to check and the filter does not run. Which forms of an
    entry are read (URLs, wildcards, hosts-file lines, IDN either way) and which refused: runconfig/blocklist.py."""

    enabled: bool = True
    blocked_domains: list[str] = []  # a listed domain blocks itself and every subdomain of it
    blocked_urls: list[str] = []  # exact URLs, with or without the scheme (a trailing / ignored)
    banned_words: list[str] = []  # a word of the URL (split on non-alphanumerics) on the list
    soft_banned_words: list[str] = []  # at least soft_word_threshold of these words in the URL
    soft_word_threshold: int = Field(2, ge=1)
    banned_subwords: list[str] = []  # a substring of the URL with non-alphanumerics removed, lowercased

    @field_validator(*LIST_KINDS)
    @classmethod
    def _lists_readable(cls, v: list[str], info: ValidationInfo) -> list[str]:
        """Every file is read at load with the filter's own rules (runconfig/blocklist.py): a missing file, a
        directory, a binary file or an entry that could never match is refused here, naming file, line and entry."""
        for path in v:
            read_blocklist(path, str(info.field_name))
        return v

    def active(self) -> bool:
        """Whether the filter runs (the report's `enabled`): switched on and given at least one list."""
        lists = (
            self.blocked_domains,
            self.blocked_urls,
            self.banned_words,
            self.soft_banned_words,
            self.banned_subwords,
        )
        return self.enabled and any(lists)


PiiKind = Literal["email", "ip", "phone"]
PII_KINDS: tuple[PiiKind, ...] = ("email", "ip", "phone")


class PiiConfig(Options):
    """PII redaction (a formatter: it rewrites text, never drops a document). On by default: emails, public IP
    addresses and phone numbers in published web text identify people and teach a model nothing it needs."""

    enabled: bool = True
    kinds: list[PiiKind] = list(PII_KINDS)
    only_public_ips: bool = True  # as datatrove: private, loopback, documentation ... addresses are kept
    email_replacement: str = "email@example.com"
    ipv4_replacement: str = "192.0.2.1"  # TEST-NET-1 (RFC 5737): reserved, never anyone's address
    ipv6_replacement: str = "2001:db8::1"  # the IPv6 documentation prefix (RFC 3849)
    phone_replacement: str = "555-0100"  # the NANP block reserved for fiction


@dataclass(frozen=True)
class FilterKind:
    """A filter as data: its name, the type of its settings and the `data.clean` key of its section."""

    name: str
    settings: type[BaseModel] | None = None
    section: str | None = None  # built-ins: `data.clean.<section>` holds the settings their params override


# The built-in filters in their default order: URL blocklists (cheapest, on the URL alone), unicode repair, language
# ID, Gopher repetition + quality, C4 (it edits lines), FineWeb (after C4, as in the FineWeb recipe), then PII
# redaction, which rewrites only the text that is kept.
BUILTIN_FILTER_KINDS = (
    FilterKind("url", UrlFilterConfig, "url"),
    FilterKind("unicode", UnicodeConfig, "unicode"),
    FilterKind("langid", LangIdConfig, "langid"),
    FilterKind("gopher_repetition", GopherRepetitionConfig, "gopher_repetition"),
    FilterKind("gopher_quality", GopherQualityConfig, "gopher_quality"),
    FilterKind("c4", C4Config, "c4"),
    FilterKind("fineweb", FineWebQualityConfig, "fineweb"),
    FilterKind("pii", PiiConfig, "pii"),
)
BUILTIN_FILTERS = tuple(k.name for k in BUILTIN_FILTER_KINDS)
