# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Credentials in environment values, replaced by a short digest before they leave the host.

A variable whose name looks secret (``DB_PASSWORD``, ``API_TOKEN``, ...) has its whole value
digested, as before. Any other value is searched for credentials inside it, and only those are
replaced, in place, so the rest stays readable and comparable:

- URL userinfo: ``postgres://app:PASS@db/x`` -> ``postgres://app:<redacted sha256:...>@db/x``
  (the last ``@`` of the authority ends it, so a password with an unencoded ``@`` is covered), and
  Oracle's ``jdbc:oracle:thin:app/PASS@host``;
- ``key=value`` pairs whose key names a secret (``password``, ``passwd``, ``pwd``, ``pass``,
  ``secret``, ``token``, ``api_key``, ``AccountKey``, ``sig``, ``X-Amz-Signature``, ...), in query
  strings, ``k=v;k=v`` connection strings (ODBC ``Pwd={...}`` braces, ``}}`` inside, and quoted
  values included),
  command lines (``--token=...``, ``--password ...``) and JSON (``"password": "..."``);
- AWS access key ids (``AKIA`` / ``ASIA`` and 16 more) and 40-character secret keys after a
  key-ish word or right after the key id;
- ``Authorization:`` header values, ``Bearer`` tokens, and GitHub / GitLab / Slack tokens.

Every secret becomes ``<redacted sha256:XXXXXXXXXXXX>`` (the first 12 hex digits of the SHA-256 of
the secret itself): equal secrets still compare equal across hosts, so a drift report sees that
they differ without showing them. The rules run on the original text and overlapping matches are
merged, so a replacement is never matched again.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re


class _Pattern(object):
    """A regular expression compiled where it is first used: these take ~2.4 ms of a host's CPU to compile, on
    every scan (the ``re`` cache lives in one process), and a scan whose units set no environment redacts
    nothing. It reads as the compiled pattern does; once used, its methods are the compiled pattern's own."""

    def __init__(self, pattern, flags=0):
        self._source = (pattern, flags)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_source":
            raise AttributeError(name)
        value = getattr(re.compile(*self._source), name)
        setattr(self, name, value)
        return value


DIGEST_HEX = 12
# A variable name that looks secret: its whole value is digested (the rule units.redact had).
SECRET_NAME_RE = _Pattern(r"(?i)(PASS|SECRET|TOKEN|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH)")

# scheme://authority (the authority ends at the first / ? # or blank)
_URL_AUTHORITY = _Pattern(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://(?P<authority>[^/?#\s\"'<>]*)")
# jdbc:oracle:thin:USER/PASS@host
_ORACLE = _Pattern(r"(?i)jdbc:oracle:[a-z0-9]+:[^/@\s\"']*/(?P<v>[^@\s\"']+)@")

# Keys that name a secret: anywhere at the end of the key (PGPASSWORD, client_secret,
# X-Amz-Security-Token, X-Amz-Signature), or whole words only where a short word is also an
# ordinary one (pass, pwd, sig, key after api/access/account/...).
_KEY = (
    r"(?:[\w.-]{0,64}?(?:password|passwd|passphrase|secret|token|credentials?|signature|apikey)"
    r"|(?:[\w.-]{0,64}?[_.-])?(?:pass|pwd|pw|sig)"
    r"|[\w.-]{0,64}?(?:api|access|secret|private|account|sharedaccess|client|master|sas|subscription)"
    r"[_.-]?key)"
)
# key=value (query strings, connection strings, --flag=value, command lines: --password value)
_PAIR = _Pattern(
    r"(?i)(?<![\w.-])(?:(?P<key>" + _KEY + r")\s*=\s*|--(?P<flag>" + _KEY + r")\s+(?!-))"
    r"(?:\{(?P<brace>(?:[^}]|\}\})*)\}|\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<bare>[^&;\s\"']+))"
)
# "key": "value" (JSON)
_JSON_PAIR = _Pattern(r"(?i)\"" + _KEY + r"\"\s*:\s*\"(?P<v>(?:[^\"\\]|\\.)*)\"")
# AWS access key ids; a 40-character secret key after the id or after a key-ish word
_AWS_KEY_ID = _Pattern(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_AWS_SECRET = _Pattern(
    r"(?i)(?:(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}[\s:,;|]+"
    r"|(?:secret|key)[\"']?(?:\s*[:=]\s*|\s+)[\"']?)"
    r"(?P<v>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)
# Authorization: <scheme> <credentials>; Bearer <token>; well-known token formats
_AUTHORIZATION = _Pattern(
    r"(?i)(?<![\w-])(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|aws4-hmac-sha256)\s+)?(?P<v>[^\s\"',;]+)"
)
_BEARER = _Pattern(r"(?i)(?<![\w-])bearer\s+(?P<v>[A-Za-z0-9._~+/-]{8,}=*)")
_KNOWN_TOKENS = _Pattern(
    r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})"
)


# A digest this module wrote: never redacted again (redacting twice changes nothing).
_DIGEST_TOKEN = _Pattern(r"<redacted sha256:[0-9a-f]{%d}>" % DIGEST_HEX)


def digest(secret):
    """``<redacted sha256:XXXXXXXXXXXX>``: the first 12 hex digits of the SHA-256 of ``secret``."""
    # imported here: hashlib (OpenSSL) costs every host ~2 ms to import, and most scans digest nothing
    from hashlib import sha256

    data = secret.encode("utf-8", "surrogatepass")
    return "<redacted sha256:%s>" % sha256(data).hexdigest()[:DIGEST_HEX]


def _url_password_spans(text):
    for match in _URL_AUTHORITY.finditer(text):
        authority = match.group("authority")
        at = authority.rfind("@")
        if at < 0:
            continue
        colon = authority.find(":", 0, at)
        if colon < 0 or colon + 1 == at:
            continue  # user only (ssh://git@host), or an empty password
        start = match.start("authority")
        yield start + colon + 1, start + at


def _group_spans(regex, text, groups):
    for match in regex.finditer(text):
        for group in groups:
            if match.group(group):
                yield match.start(group), match.end(group)
                break


def secret_spans(text):
    """The (start, end) of every credential found inside ``text``, overlapping ones merged, in order."""
    spans = []
    spans.extend(_url_password_spans(text))
    spans.extend(_group_spans(_ORACLE, text, ("v",)))
    spans.extend(_group_spans(_PAIR, text, ("brace", "dq", "sq", "bare")))
    spans.extend(_group_spans(_JSON_PAIR, text, ("v",)))
    spans.extend(m.span() for m in _AWS_KEY_ID.finditer(text))
    spans.extend(_group_spans(_AWS_SECRET, text, ("v",)))
    spans.extend(_group_spans(_AUTHORIZATION, text, ("v",)))
    spans.extend(_group_spans(_BEARER, text, ("v",)))
    spans.extend(m.span() for m in _KNOWN_TOKENS.finditer(text))
    done = [m.span() for m in _DIGEST_TOKEN.finditer(text)]
    if done:
        spans = [(s, e) for s, e in spans if not any(ds <= s and e <= de for ds, de in done)]
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def redact_text(text):
    """``text`` with every credential found inside it replaced by its digest; the rest unchanged."""
    out = []
    last = 0
    for start, end in secret_spans(text):
        out.append(text[last:start])
        out.append(digest(text[start:end]))
        last = end
    out.append(text[last:])
    return "".join(out)


def redact_value(name, value):
    """What may be shown of variable ``name``'s ``value``: all of it digested when the name looks
    secret, else the value with the credentials inside it digested. A value that is not a string
    is returned as it is."""
    if not isinstance(value, str):
        return value
    if SECRET_NAME_RE.search(name or ""):
        return digest(value)
    return redact_text(value)


def redact_env(env):
    """``env`` (a dict name -> value) with every value passed through ``redact_value``."""
    return dict((name, redact_value(name, value)) for name, value in env.items())
