"""Reading URL blocklist files: which forms of an entry are read, to what, and which are refused.

Here, below the data pipeline, so the config's loader refuses a bad list naming the key, the file, the line and
the entry before any work starts, and the URL filter reads the lists with the very same rules. A list entry that
is read but can never match is the failure this guards against: UT1, Shallalist, hosts files and adblock lists
write the same domain in half a dozen ways, and an entry kept as written (`https://bad.example/`, `*.bad.example`,
`bad.example.`, `bücher.example` against a crawl's `xn--bcher-kva.example`) silently blocks nothing.

Domain lists (`blocked_domains`), one entry a line, each read as the domain it names (which then blocks itself and
every subdomain, the filter's rule):
- `bad.example`, `BAD.Example` (case folded), `bad.example.` (the DNS root dot dropped), `bad.example:8080` (the
  port dropped: a host is blocked on every port);
- `*.bad.example` and `.bad.example` (the wildcard and Squid's leading-dot form: "this domain's subdomains"; the
  domain itself is blocked too, since the rule is a domain and its subdomains);
- `https://bad.example` or `https://bad.example/` (a URL with no path: its host);
- `0.0.0.0 bad.example other.example` (a hosts-file line: its host names) and `||bad.example^` (adblock's domain
  anchor);
- an internationalised name in either form: `bücher.example` is read as its punycode `xn--bcher-kva.example`, and
  a crawl URL's host is converted the same way, so either form in the list matches either form in the crawl.
Refused, with the file, the line number and the entry: a path (`bad.example/ads`, `https://bad.example/ads`: it
names pages, not a domain; list it in `blocked_urls`), a wildcard anywhere but in front, a space inside, and
anything that is not a host name (labels of letters, digits, `-` and `_`, at most 63 characters each).

URL lists (`blocked_urls`): `https://bad.example/page` or UT1's scheme-less `bad.example/page`; the scheme, a
trailing `/`, the host's case, its trailing dot, its port and its IDN form do not matter (the path's case does not
either: URLs are compared lowercased, as before). A wildcard or a space is refused.

Word lists (`banned_words`, `soft_banned_words`): one word of the URL, letters and digits (compared lowercased).
`free-money` is refused: a URL is split into words on every other character, so a word holding a `-` never
matches one; it belongs in `banned_subwords`, which matches the URL with every non-alphanumeric removed (an entry
there is read the same way, `free-money` as `freemoney`). An entry with no ASCII letter or digit is refused too
(it would match nothing).

Every list: `#` starts a comment (a whole line, or after whitespace), blank lines are skipped, and a file that is
not UTF-8 text (NUL bytes: a gzip or tar of the list rather than the list) is refused naming the file.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, ValidationInfo

LIST_KINDS = ("blocked_domains", "blocked_urls", "banned_words", "soft_banned_words", "banned_subwords")

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_HOSTS_LINE = re.compile(r"(?:0\.0\.0\.0|127\.0\.0\.1|::1?|::)\s+(.+)")
_ADBLOCK = re.compile(r"\|\|([^/^$|*]+)\^")
_INLINE_COMMENT = re.compile(r"\s+#.*$")
_DOMAIN_EXPECTED = (
    "expected one domain a line (bad.example, *.bad.example, a URL without a path, a hosts-file line)"
)


class BlocklistError(ValueError):
    """A list file or one of its entries that cannot be read as the list's kind: the message names the file (and
    the line number and the entry) and says what form is expected."""


def normalize_words(text: str) -> str:
    """A URL's text with every non-alphanumeric removed, lowercased (datatrove's URLFilter normaliser)."""
    return _NON_ALNUM.sub("", text).lower()


def host_key(host: str) -> str | None:
    """A host as the lists compare it: case folded, no trailing dot, punycode for an internationalised name; None
    when it is not a valid host name."""
    host = host.strip().rstrip(".")
    if not host:
        return None
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    host = host.lower()
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(lab) for lab in labels):
        return None
    return host


def url_key(url: str) -> str | None:
    """A URL as `blocked_urls` compares it: host (as `host_key`) + path (+ `?query`), lowercased, without the
    scheme, the port or a trailing `/`; None when it has no valid host."""
    url = url.strip()
    try:
        parts = urlsplit(url if "://" in url else "//" + url)
        host = parts.hostname
    except ValueError:
        return None
    key = host_key(host or "")
    if key is None:
        return None
    rest = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "")
    return (key + rest).lower()


def _domain(entry: str) -> tuple[list[str], str | None]:
    """(the domains an entry names, None) or ([], why it is refused)."""
    hosts = _HOSTS_LINE.fullmatch(entry)
    if hosts:
        names = hosts.group(1).split()
        out = [host_key(h) for h in names]
        if any(h is None for h in out):
            return [], "is a hosts-file line naming something that is not a host"
        return [h for h in out if h], None
    ad = _ADBLOCK.fullmatch(entry)
    if ad:
        entry = ad.group(1)
    elif entry.startswith("||") or entry.startswith("@@"):
        return [], "is an adblock rule with options or a path (only ||domain^ names a domain)"
    if any(c.isspace() for c in entry):
        return [], "holds a space"
    if "://" in entry:
        try:
            parts = urlsplit(entry)
            host = parts.hostname or ""
        except ValueError:
            return [], "is not a URL or a domain"
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            return [], "is a URL with a path: it names pages, not a domain (list it in blocked_urls)"
        entry = host
    elif "/" in entry:
        return [], "has a path: it names pages, not a domain (list it in blocked_urls)"
    if entry.startswith("*."):
        entry = entry[2:]
    elif entry.startswith("."):
        entry = entry[1:]
    if "*" in entry:
        return [], "has a wildcard that is not a leading '*.'"
    if entry.count(":") == 1 and entry.rsplit(":", 1)[1].isdigit():
        entry = entry.rsplit(":", 1)[0]
    key = host_key(entry)
    if key is None:
        return [], "is not a host name"
    return [key], None


def _entry(kind: str, entry: str) -> tuple[list[str], str | None]:
    """(the keys an entry is read as, None) or ([], why it is refused), for a list of `kind`."""
    if kind == "blocked_domains":
        keys, why = _domain(entry)
        return keys, (f"{why}; {_DOMAIN_EXPECTED}" if why else None)
    if kind == "blocked_urls":
        if "*" in entry or any(c.isspace() for c in entry):
            why = "holds a wildcard" if "*" in entry else "holds a space"
            return [], f"{why}; expected one URL a line (https://bad.example/page or bad.example/page)"
        key = url_key(entry)
        if key is None:
            return (
                [],
                "has no valid host; expected one URL a line (https://bad.example/page or bad.example/page)",
            )
        return [key], None
    word = normalize_words(entry)
    if not word:
        return [], "has no ASCII letter or digit, and URLs are compared on a-z and 0-9 only"
    if kind in ("banned_words", "soft_banned_words") and _NON_ALNUM.search(entry):
        return [], (
            "is more than one URL word (a URL is split into words on every character but a-z and 0-9); "
            "expected one word a line, or list it in banned_subwords"
        )
    return [word], None


_LOWER_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_PLAIN = {
    "blocked_domains": re.compile(rf"(?:{_LOWER_LABEL}\.)*{_LOWER_LABEL}"),
    "banned_words": re.compile(r"[a-z0-9]+"),
    "soft_banned_words": re.compile(r"[a-z0-9]+"),
    "banned_subwords": re.compile(r"[a-z0-9]+"),
}


@lru_cache(maxsize=16)
def _read(path: str, kind: str, mtime_ns: int, size: int) -> dict[str, str]:
    with open(path, "rb") as fh:
        data = fh.read()
    if b"\0" in data:
        raise BlocklistError(
            f"blocklist file '{path}' is binary (NUL bytes), not a text list: one entry a line"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise BlocklistError(
            f"blocklist file '{path}' is not UTF-8 text (line {line}): one entry a line, UTF-8"
        ) from None
    out: dict[str, str] = {}
    plain = _PLAIN.get(kind)  # the form nearly every line of a real list has: itself, no parsing needed
    for no, raw in enumerate(text.splitlines(), 1):
        entry = raw.strip()
        if not entry or entry[0] == "#":
            continue
        if plain is not None and len(entry) <= 253 and plain.fullmatch(entry):
            out[entry] = entry
            continue
        entry = _INLINE_COMMENT.sub("", entry).strip()
        if not entry:
            continue
        keys, why = _entry(kind, entry)
        if why is not None:
            raise BlocklistError(f"blocklist '{path}' line {no}: {entry!r} {why}")
        out.update((k, entry) for k in keys)
    return out


def check_list_file(path: str) -> str:
    """The expanded path of a list file, or BlocklistError: missing, a directory, not a plain file."""
    from core.paths import expand_placeholders  # here: loading a config imports no fsspec otherwise

    full = expand_placeholders(path)
    if os.path.isdir(full):
        raise BlocklistError(
            f"blocklist file '{path}' is a directory (expanded to '{full}'): name a list file in it (UT1 and "
            "Shallalist ship a folder per category holding 'domains' and 'urls')"
        )
    if not os.path.isfile(full):
        raise BlocklistError(f"blocklist file '{path}' does not exist (expanded to '{full}')")
    return full


def read_blocklist(path: str, kind: str) -> dict[str, str]:
    """{key the filter compares: the entry as written} for one list file of `kind` (one of LIST_KINDS); read once
    per process per file version (the dict is shared: do not change it). BlocklistError names the file, and the
    line and entry, on what is refused."""
    full = check_list_file(path)
    st = os.stat(full)
    return _read(full, kind, st.st_mtime_ns, st.st_size)


def _readable_lists(paths: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
    """Every file of one list setting, read at load with the filter's own rules: a missing file, a directory, a
    binary file or an entry that could never match is refused here, naming file, line and entry."""
    for path in paths:
        read_blocklist(path, str(info.field_name))
    return paths


# A URL filter's list setting: files, each read (and checked) at load by the rules above.
BlocklistFiles = Annotated[tuple[str, ...], AfterValidator(_readable_lists)]
