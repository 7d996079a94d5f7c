"""PII redaction: a formatter that rewrites text (it never drops a document), as datatrove's PIIFormatter does
for emails and IPv4 addresses, plus IPv6 addresses and phone numbers, which datatrove leaves in.

Each kind is replaced by one fixed placeholder that the rules themselves leave alone (an example.com address,
documentation-range IPs, a fictional phone number), so cleaning cleaned text changes nothing. Differs from
datatrove on purpose: datatrove rotates through several look-alike replacements per kind; one fixed placeholder per
kind makes the result a function of the document. The rules (measured on bench/data/pii_labelled.jsonl by
bench/pii_quality.py, precision and recall per kind):

- E-mail: `local@domain.tld`, case-insensitive (datatrove's pattern is lowercase only, so `John@Gmail.COM` stayed).
  The local part is letters, digits and `._%+-` (not `/ = ? &`, so an address in a URL's query is taken without
  the URL before it); the domain needs a top-level label of letters (or `xn--` punycode) that is not an image
  extension (`logo@2x.png`, `react@18.2.0` are file and package names). Not an address: one that is a URL's user
  (`https://user:pass@host`, `ssh://git@host/...`), one after `word:` that is not a mail label (`user:pass@host`;
  `mailto:`, `Email:`, `From:` ... are labels) and git's `git@host:path` (a `:` and a path right after it).
- IPv4: four octets 0-255 without leading zeros, the last not 0 (`x.y.z.0` names a network, or a version), not
  part of a longer dotted run (`1.2.3.4.5`, an OID), of a word or of a file name (`sqlite-3.45.1.1`); not right
  after a word that introduces a version or a numbered part of a document (`version 1.2.3.4`, `v2.10.0.1`,
  `build`, `release`, `firmware`, `section`, `§`, `clause`, `chapter`, `article`, `table` ...), and not after a
  version named earlier in its sentence (`Firmware 2.4.1.9 and the 1.0.0.4 bootloader`) unless an address word
  introduces it (`IP`, `address`, `host`, `server`, `listens on` ...). Still missed, as the set shows: a version
  after a bare product name (`Java 17.0.8.1`, `Kernel 6.1.0.18`).
- IPv6: what `ipaddress` accepts. Public means global unicast (`2000::/3`, the only space the registries hand out)
  and `is_global`, so `3::1`, `a::b`, `23::4` (scores, C++ scopes, verses) are kept.
- IPv4 and IPv6 are replaced only when public: private, loopback, link-local and documentation addresses identify
  nobody and are kept, as datatrove does (`only_public_ips: false` replaces every valid address).
- Phone: a run of digit groups (one space, `.` or `-` between groups) in a format a country dials:
  international (`+` or `00` and a country code, 8 to 15 digits, at most 6 groups after the code), national with
  a trunk `0` (`020 7946 0958`, `0845 8 505 505`, `01 23 45 67 89`, `(02) 9876 5432`: 9 to 12 digits, 2 to 5
  groups, the first 2 to 5 digits long), North American (`(212) 555-0187`, `1-800-555-0199`: area and exchange
  codes starting 2-9, then 4 digits) or an area code in parentheses (`(11) 91234-5678`, 10 to 12 digits). Kept:
  numbers in thousands grouping (`12 345 678 901 euros`), runs of scores or years (`100 200 300 400 500`,
  `1998 2003 2005`), dates, versions, and numbers after a label that says what they are (`order`, `invoice`,
  `ISBN`, `serial`, `account`, `ticket`, `ref`, `no.`, `#` ...).
"""

from __future__ import annotations

import ipaddress
import re
from typing import ClassVar, Literal

from data_pipeline.formatters.base import Formatter

EMAIL_RE = re.compile(
    r"(?<![\w.%+-])[a-z0-9_%+-](?:[a-z0-9._%+-]*[a-z0-9_%+-])?@"
    r"((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:[a-z]{2,63}|xn--[a-z0-9-]{1,59}))(?![\w-]|\.[a-z0-9])",
    re.IGNORECASE,
)
_IMAGE_EXT = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "avif"})
_URL_USERINFO = re.compile(r"[a-z][a-z0-9+.-]*://[^\s/@]*$", re.IGNORECASE)  # the text before `user@host`
_WORD_COLON = re.compile(r"([\w-]+):$")
_MAIL_LABELS = frozenset(
    {
        "mailto",
        "email",
        "e-mail",
        "mail",
        "from",
        "to",
        "cc",
        "bcc",
        "reply-to",
        "contact",
        "sender",
        "address",
        "correo",
        "courriel",
    }
)

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# Not glued to a word, a file name (`sqlite-3.45.1.0`) or a longer dotted run; not a network address (`.0`).
IPV4_RE = re.compile(
    rf"(?<![\w.-]){_OCTET}(?:\.{_OCTET}){{2}}\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]\d|[1-9])(?!\.?\d|\w)"
)
# Words after which a dotted number names a version or a numbered part of a document, never an address.
_VERSION_WORDS = (
    r"version|ver|v|release|rel|build|firmware|fw|revision|rev|patch|update|section|sec|clause|chapter|ch|"
    r"article|art|paragraph|para|part|annex|appendix|figure|fig|table|note|item|rule|law|regulation|step|oid"
)
_VERSION_WORD = re.compile(rf"(?:\b(?:{_VERSION_WORDS})|§)\.?\s*$", re.IGNORECASE)
# A version named in the sentence: a version word before a dotted number, or a `v1.2` token.
_VERSION_IN_SENTENCE = re.compile(rf"(?:\b(?:{_VERSION_WORDS})\.?\s*|§\s*|\bv)\d+(?:\.\d+)+", re.IGNORECASE)
# Words that introduce an address: a dotted quad after one is an address even in a sentence about versions.
_ADDRESS_WORD = re.compile(
    r"\b(?:ip|ipv4|address(?:es)?|addr|host(?:name)?|server|gateway|dns|resolver|proxy|client|ping|"
    r"listens? on|connect(?:ed)? to)\W{0,3}$",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"[.!?](?:\s+|$)|\n")


def _sentence_start(text: str, start: int) -> int:
    """Where the sentence holding text[start] begins (a '.' inside a number ends nothing)."""
    lo = max(0, start - 300)
    return max((m.end() for m in _SENTENCE_END.finditer(text, lo, start)), default=lo)


def _is_version(text: str, m: re.Match) -> bool:
    """A dotted quad that names a version or a section: right after a version word, or after a version named
    earlier in its sentence (release notes list several: `Firmware 2.4.1.9 and the 1.0.0.4 bootloader`) unless an
    address word introduces it (`build 7.3.1.2 listens on 81.2.69.142`)."""
    before = text[max(0, m.start() - 30) : m.start()]
    if _VERSION_WORD.search(before):
        return True
    if _ADDRESS_WORD.search(before):
        return False
    return _VERSION_IN_SENTENCE.search(text, _sentence_start(text, m.start()), m.start()) is not None


# A candidate only (hex groups and colons, at least two colons); `ipaddress` decides what is an address.
IPV6_RE = re.compile(r"(?<![\w:.])(?:[0-9a-fA-F]{0,4}:){2,7}(?:[0-9a-fA-F]{1,4}|(?<=:):)(?![\w:])")
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")

# A run of digit groups, one separator between groups, with an optional international prefix (+CC, an optional
# (0) trunk) and an area code in parentheses; what kind of number it is, `_is_phone` decides.
PHONE_RE = re.compile(
    r"(?:\+\d{1,3}[ .-]?(?:\(0\)[ .-]?)?)?(?:\(\d{1,5}\)[ .-]?)?\d{1,10}(?:[ .-]\d{1,10})*(?![\w@]|[.,/:-]?\d)"
)
_NANP = re.compile(r"(?:\+?1[ .-]?)?(?:\([2-9]\d\d\)[ .-]?|[2-9]\d\d[ .-])[2-9]\d\d[ .-]\d{4}")
_YEAR = re.compile(r"(?:19|20)\d\d")
# Labels that say what a number is: an order, an invoice, a book ... (then it is not a phone number).
_NUMBER_LABEL = re.compile(
    r"(?:\b(?:order|invoice|ref|reference|ticket|tracking|account|acct|serial|part|item|isbn|issn|sku|case|"
    r"transaction|receipt|policy|booking|confirmation|customer|member|id)\b\.?(?:\s*(?:number|no|nr|num)\b\.?)?"
    r"(?:\s*(?:is|was))?|\bno\.|#|№)\s*[:#]?\s*$",
    re.IGNORECASE,
)
# Prefilters: a plain scan for what every match must contain is much cheaper than the full pattern.
_DOTTED_QUAD = re.compile(r"\d\.\d{1,3}\.\d")
_HEX_COLONS = re.compile(r"[0-9a-fA-F]?::|[0-9a-fA-F]:[0-9a-fA-F]{1,4}:")
_DIGIT_RUN = re.compile(r"\d[ .()-]{0,2}\d[ .()-]{0,2}\d[ .()-]{0,2}\d[ .()-]{0,2}\d")


def _ip_ok(text: str, public_only: bool) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    if not public_only:
        return True
    return ip.is_global and (ip.version == 4 or ip in _GLOBAL_UNICAST)


def _is_email(text: str, start: int, m: re.Match) -> bool:
    if m.group(1).rsplit(".", 1)[1].lower() in _IMAGE_EXT:
        return False
    before = text[max(0, start - 200) : start]
    if _URL_USERINFO.search(before):  # https://user:pass@host, ssh://git@host/...
        return False
    word = _WORD_COLON.search(before)
    if word and word.group(1).lower() not in _MAIL_LABELS:  # user:pass@host
        return False
    after = text[m.end() : m.end() + 2]
    return not (after[:1] == ":" and after[1:2] not in ("", " ", "\t", "\n"))  # git@github.com:owner/repo


def _is_phone(text: str, before: str) -> bool:
    """Whether a digit run (PHONE_RE's match) is written as a phone number is written somewhere."""
    if _NUMBER_LABEL.search(before[-40:]):
        return False
    groups = re.findall(r"\d+", text)
    digits = sum(map(len, groups))
    if text.startswith("+") or (text.startswith("00") and len(groups[0]) >= 3):
        cc = len(groups[0]) if text.startswith("+") else len(groups[0]) - 2
        n_groups = len(groups) - (1 if text.startswith("+") else 0) - ("(0)" in text)
        if text.startswith("00"):
            digits -= 2
        return 8 <= digits - ("(0)" in text) <= 15 and 1 <= cc <= 3 and n_groups <= 6
    if all(_YEAR.fullmatch(g) for g in groups):
        return False
    if _NANP.fullmatch(text):
        return True
    if text.startswith("(") and 10 <= digits <= 12 and len(groups) <= 5:
        return True  # an area code in parentheses: (02) 9876 5432, (11) 91234-5678
    first = groups[0]
    return first[0] == "0" and 2 <= len(first) <= 5 and 9 <= digits <= 12 and 2 <= len(groups) <= 5


PiiKind = Literal["email", "ip", "phone"]

# Each kind's placeholder: one the rules themselves leave alone, so cleaning cleaned text changes nothing. Fixed, not
# settings: a bench that needs others (bench/pii_quality.py marks each kind) overrides PLACEHOLDERS in a subclass.
PLACEHOLDERS: dict[str, str] = {
    "email": "email@example.com",
    "ipv4": "192.0.2.1",  # TEST-NET-1 (RFC 5737): reserved, never anyone's address
    "ipv6": "2001:db8::1",  # the IPv6 documentation prefix (RFC 3849)
    "phone": "555-0100",  # the NANP block reserved for fiction
}
_FIXED = "the placeholders are fixed (data_pipeline/formatters/pii.py PLACEHOLDERS); a bench overrides them in a subclass"


class PiiFormatter(Formatter):
    """PII redaction (a formatter: it rewrites text, never drops a document). On by default: emails, public IP
    addresses and phone numbers in published web text identify people and teach a model nothing it needs."""

    name = "pii"
    PLACEHOLDERS: ClassVar[dict[str, str]] = PLACEHOLDERS
    removed_params: ClassVar[dict[str, str]] = {
        f"{k}_replacement": _FIXED for k in ("email", "ipv4", "ipv6", "phone")
    }

    def __init__(
        self,
        kinds: tuple[PiiKind, ...] = ("email", "ip", "phone"),
        only_public_ips: bool = True,  # as datatrove: private, loopback, documentation ... addresses are kept
    ):
        super().__init__()
        self.kinds = tuple(kinds)
        self.public_only = only_public_ips
        self.repl = dict(self.PLACEHOLDERS)

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, kind) of every item to redact, in text order, none overlapping: e-mails first, then IP
        addresses, then phone numbers, each outside what an earlier kind took."""
        spans: list[tuple[int, int, str]] = []

        def free(s: int, e: int) -> bool:
            return all(e <= a or s >= b for a, b, _ in spans)

        # Cheap guards first: most documents have no '@', no run of dotted digits, no '::'-style groups.
        if "email" in self.kinds and "@" in text:
            spans += [
                (m.start(), m.end(), "email")
                for m in EMAIL_RE.finditer(text)
                if _is_email(text, m.start(), m)
            ]
        if "ip" in self.kinds:
            if _DOTTED_QUAD.search(text):
                for m in IPV4_RE.finditer(text):
                    if (
                        free(m.start(), m.end())
                        and _ip_ok(m.group(0), self.public_only)
                        and not _is_version(text, m)
                    ):
                        spans.append((m.start(), m.end(), "ipv4"))
            if _HEX_COLONS.search(text):
                spans += [
                    (m.start(), m.end(), "ipv6")
                    for m in IPV6_RE.finditer(text)
                    if free(m.start(), m.end()) and _ip_ok(m.group(0), self.public_only)
                ]
        if "phone" in self.kinds and _DIGIT_RUN.search(text):
            for m in PHONE_RE.finditer(text):
                s = m.start()
                prev = text[s - 1 : s]
                # not inside a word, a number, a path or an address; a '+' may follow 'tel:'
                if prev and (prev.isalnum() or prev in "_+.,/@-" or (prev == ":" and m.group(0)[0] != "+")):
                    continue
                if free(s, m.end()) and _is_phone(m.group(0), text[max(0, s - 40) : s]):
                    spans.append((s, m.end(), "phone"))
        return sorted(spans)

    def format(self, text: str) -> str:
        """The text with every item `find` reports replaced by its kind's placeholder (counted per kind)."""
        return self.redact(text)

    def redact(self, text: str) -> str:
        spans = self.find(text)
        if not spans:
            return text
        out, at = [], 0
        for s, e, kind in spans:
            out += [text[at:s], self.repl[kind]]
            self.stats[kind] += text[s:e] != self.repl[kind]  # a placeholder found again is no replacement
            at = e
        out.append(text[at:])
        return "".join(out)
