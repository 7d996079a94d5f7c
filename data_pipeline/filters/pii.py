"""PII redaction: a formatter that rewrites text (it never drops a document), as datatrove's PIIFormatter does
for emails and IPv4 addresses, plus IPv6 addresses and phone numbers, which datatrove leaves in.

Emails use datatrove's pattern. An IP address is replaced only when it is public (`ipaddress`'s `is_global`,
datatrove's test): private, loopback, link-local and documentation addresses identify nobody and are kept
(`only_public_ips: false` replaces every valid address). Each kind is replaced by one fixed placeholder that
the rules themselves leave alone (an example.com address, documentation-range IPs, a fictional phone number),
so cleaning cleaned text changes nothing. Differs from datatrove on purpose: datatrove rotates through several
look-alike replacements per kind; one fixed placeholder per kind makes the result a function of the document.

Phone numbers: an international number (`+` and a country code) or a national one written in groups
(`(555) 123-4567`, `020 7946 0958`, `555.123.4567`), 10 to 15 digits in all (8 with a `+`); shorter runs of
numbers (`scores 100 200 300`) and runs of years (`1998 2003 2005`) are kept.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter

from core.document import Document

EMAIL_RE = re.compile(  # datatrove's
    r"\b[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[a-z0-9](?:[a-z0-9-]*["
    r"a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]*[a-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25["
    r"0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[a-z0-9-]*[a-z0-9]:)])"
)
IPV4_RE = re.compile(  # datatrove's
    r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
)
# A candidate only (hex groups and colons, at least two colons); `ipaddress` decides what is an address.
IPV6_RE = re.compile(r"(?<![\w:.])(?:[0-9a-fA-F]{0,4}:){2,7}(?:[0-9a-fA-F]{1,4}|(?<=:):)(?![\w:])")
PHONE_RE = re.compile(
    r"(?<![\w+.,/-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{2,5}[ .-])(?:\d{2,4}[ .-]){0,2}\d{3,6}(?![\w.,/-]\d|\w)"
)
# Prefilters: a plain scan for what every match must contain is much cheaper than the full pattern.
_DOTTED_QUAD = re.compile(r"\d\.\d{1,3}\.\d")
_HEX_COLONS = re.compile(r"[0-9a-fA-F]?::|[0-9a-fA-F]:[0-9a-fA-F]{1,4}:")
_YEAR = re.compile(r"(?:19|20)\d\d")


def _ip_ok(text: str, public_only: bool) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    return ip.is_global or not public_only


def _is_phone(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    if not (8 if text.startswith("+") else 10) <= digits <= 15:
        return False
    groups = re.findall(r"\d+", text)
    return text.startswith("+") or not all(_YEAR.fullmatch(g) for g in groups)


class PiiFormatter:
    name = "pii"

    def __init__(
        self,
        kinds: list[str] = ("email", "ip", "phone"),
        only_public_ips: bool = True,
        email_replacement: str = "email@example.com",
        ipv4_replacement: str = "192.0.2.1",
        ipv6_replacement: str = "2001:db8::1",
        phone_replacement: str = "555-0100",
    ):
        self.kinds = tuple(kinds)
        self.public_only = only_public_ips
        self.repl = {
            "email": email_replacement,
            "ipv4": ipv4_replacement,
            "ipv6": ipv6_replacement,
            "phone": phone_replacement,
        }
        self.stats: Counter = Counter()  # replacements per kind, summed into the clean report

    def _sub(self, kind: str, pattern: re.Pattern, text: str, valid=None) -> str:
        def one(m: re.Match) -> str:
            if valid is not None and not valid(m.group(0)):
                return m.group(0)
            self.stats[kind] += 1
            return self.repl[kind]

        return pattern.sub(one, text)

    def redact(self, text: str) -> str:
        # Cheap guards first: most documents have no '@', no run of dotted digits, no '::'-style groups.
        if "email" in self.kinds and "@" in text:
            text = self._sub("email", EMAIL_RE, text)
        if "ip" in self.kinds:
            if _DOTTED_QUAD.search(text):
                text = self._sub("ipv4", IPV4_RE, text, lambda s: _ip_ok(s, self.public_only))
            if _HEX_COLONS.search(text):
                text = self._sub("ipv6", IPV6_RE, text, lambda s: _ip_ok(s, self.public_only))
        if "phone" in self.kinds:
            text = self._sub("phone", PHONE_RE, text, _is_phone)
        return text

    def __call__(self, doc: Document) -> tuple[bool, None]:
        doc.text = self.redact(doc.text)
        return True, None
