"""Credentials never leave the process: URIs lose their password, secret values are masked.

Environment variables whose names look like credentials (``*TOKEN*``, ``*PASSWORD*``, ``AWS_*``,
``HF_*`` ...) are never recorded, and their values are masked wherever they appear in text the
workbench stores or prints (params, tags, config.yaml, manifests, error lines); ``name=value``
pairs with credential-like names lose their value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

# Credential-like names (substring match on the upper-cased name), and families of variables
# that are never recorded at all.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SECRET_PREFIXES = ("AWS_", "HF_", "HUGGING_FACE_")
MASK = "***"
# Values shorter than this are not hunted for in free text ("1", "true" would mangle it);
# the variables themselves are still never recorded.
MIN_SECRET_VALUE_LENGTH = 8
# scheme://user:password@host -> scheme://user:***@host (also with an empty user).
URI_PASSWORD = re.compile(r"(://[^:/@\s]*):[^@/\s]+@")
URI_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")
# name=value on a command line or in an override, where the name looks like a credential.
# Masking must stay linear in the text's length whatever it holds (a 1 MB run name): a name
# is matched only from the start of a run of name characters, possessively (``++``, Python
# 3.11), so no position is scanned twice; whether it is a credential is decided on the name.
ASSIGNMENT_NAME = re.compile(r"(?<![\w.+-])[\w.+-]++=(?!=)")  # (?!=): "tokenizers==0.15"
SECRET_NAME_WORD = re.compile(
    r"(?i)token|secret|password|passwd|api_?key|access_?key|credential"
)
ASSIGNMENT_VALUE = re.compile(r"[^\s'\"]++")


def redact_uri(uri: str) -> str:
    """A tracking URI without its password (``scheme://user:***@host``)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", uri)


def is_secret_name(name: str) -> bool:
    """True for names that look like credentials (``HF_TOKEN``, ``db_password``, ``AWS_*``)."""
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS) or upper.startswith(SECRET_PREFIXES)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of credential-named environment variables, longest first, to mask in text."""
    env = os.environ if environ is None else environ
    values = {
        v for k, v in env.items()
        if any(w in k.upper() for w in SECRET_WORDS) and len(v) >= MIN_SECRET_VALUE_LENGTH
    }
    return sorted(values, key=len, reverse=True)


def scrub_text(text: str, secrets: Sequence[str] | None = None) -> str:
    """``text`` with URI passwords and credential values masked (safe for code diffs)."""
    secrets = secret_values() if secrets is None else secrets
    for value in secrets:
        text = text.replace(value, MASK)
    return URI_PASSWORD.sub(rf"\1:{MASK}@", text)


def is_secret_assignment_name(name: str) -> bool:
    """True for ``db_password``, ``HF_TOKEN.x``: a credential word after the last ``+``.

    ``+`` may prefix a Hydra override (``+api_key=...``) but not follow the word.
    """
    return SECRET_NAME_WORD.search(name.rpartition("+")[2]) is not None


def mask_assignments(text: str) -> str:
    """``text`` with the value of every ``<credential-like name>=value`` masked, in linear time."""
    parts: list[str] = []
    done = 0
    for match in ASSIGNMENT_NAME.finditer(text):
        if match.start() < done or not is_secret_assignment_name(match.group()[:-1]):
            continue
        value = ASSIGNMENT_VALUE.match(text, match.end())
        if value is None:
            continue
        parts += [text[done:match.end()], MASK]
        done = value.end()
    return "".join(parts) + text[done:]


def scrub_command(text: str, secrets: Sequence[str] | None = None) -> str:
    """:func:`scrub_text` plus the value of ``api_key=...``-style assignments."""
    return mask_assignments(scrub_text(text, secrets))


def scrub(value: Any, secrets: Sequence[str] | None = None) -> Any:
    """A copy of a JSON-like value with every secret masked.

    Mapping entries with credential-like keys keep their key (so one can see that something
    was there) but get ``***`` as value; strings go through :func:`scrub_command`.
    """
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        return scrub_command(value, secrets)
    if isinstance(value, Mapping):
        return {
            str(k): MASK if is_secret_name(str(k)) and v not in (None, "") else scrub(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [scrub(v, secrets) for v in value]
    return value


def scrub_yaml(tree: Mapping[str, Any]) -> str:
    """A config tree as YAML (same layout as ``config.to_yaml``), secrets masked."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(scrub(dict(tree))))


def remote_without_credentials(url: str) -> str:
    """A git remote URL without user/password/token (``https://tok@host/x`` -> ``https://host/x``).

    scp-like remotes (``git@github.com:org/repo``) carry no credential and are kept.
    """
    return URI_USERINFO.sub(r"\1", url)
