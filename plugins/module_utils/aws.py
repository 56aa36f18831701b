# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The one EC2 (AWS) layer: connection settings, the client factory, retries and error texts.

Used by the ``fleetops.node.ec2`` inventory plugin, by the controller's EC2 lease (through
``fleetops.ansible.collection.module_utils("aws")``) and by modules that talk to AWS, the way
amazon.aws splits ``module_utils/botocore.py`` (clients, error texts) and ``retries.py``
(throttling retries):

- ``OPTIONS``: the connection options (type, default, aliases, environment variables), defined
  here once; ``ConnectionSettings.from_options(options, environ)`` resolves and validates them
  (an option's value or an alias's, else its environment variables, else its default).
  ``argument_spec()`` is the same for an ``AnsibleModule``.
- ``session(settings)`` and ``client(settings, service="ec2", region=...)``: botocore's own
  retries are off (one attempt), so ``call``'s budget is the whole budget.
- ``call(settings, operation, region, func)`` (and the decorator ``retry``): tenacity, jittered
  exponential backoff ("full jitter": each wait is random below ``initial_backoff`` x 2^n, at most
  ``max_backoff``) on throttling (``RequestLimitExceeded``, ``Throttling``, ...), HTTP 5xx and
  connection errors, up to ``max_attempts`` attempts; what fails is one ``AwsError``,
  "Failed to call ec2:<Operation> in <region>[ after N attempts]: <cause>".
- ``error_text(exc, secrets)``: one line, with the secret key, session token and any password in
  a URL replaced by ``***``.

boto3, botocore and tenacity are imported when present (``HAS_BOTO3``, ``HAS_TENACITY``): target
hosts usually lack them, and this module must import there anyway. Importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import math
import re
from dataclasses import dataclass, field, fields
from urllib.parse import urlparse

from ansible.module_utils.common.text.converters import to_native

try:
    import boto3
    import botocore
    import botocore.config
    import botocore.exceptions
except ImportError as e:
    HAS_BOTO3 = False
    BOTO3_IMPORT_ERROR = to_native(e)
else:
    HAS_BOTO3 = True
    BOTO3_IMPORT_ERROR = None

try:
    import tenacity
except ImportError as e:
    HAS_TENACITY = False
    TENACITY_IMPORT_ERROR = to_native(e)
else:
    HAS_TENACITY = True
    TENACITY_IMPORT_ERROR = None


# Throttling answers: always worth another attempt after a wait.
THROTTLING_CODES = frozenset(
    (
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "ProvisionedThroughputExceededException",  # DynamoDB (the shared store)
    )
)
# Error codes worth another attempt (and any HTTP >= 500, whatever its code).
RETRYABLE_CODES = THROTTLING_CODES | frozenset(
    (
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    )
)

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_INITIAL_BACKOFF = 0.5
DEFAULT_MAX_BACKOFF = 20.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL")
MAX_ERROR_TEXT = 1000

# The connection options: the inventory plugin documents exactly these (a unit test compares its
# DOCUMENTATION with them), the lease resolves an inventory source's with them, a module's
# argument_spec() is made of them.
OPTIONS = {
    "endpoint_url": {"type": "str", "aliases": ["aws_endpoint_url", "ec2_url"], "env": list(ENDPOINT_ENV)},
    "aws_profile": {"type": "str", "aliases": ["profile", "boto_profile"]},
    "aws_access_key": {"type": "str", "aliases": ["access_key", "aws_access_key_id", "ec2_access_key"]},
    "aws_secret_key": {
        "type": "str",
        "aliases": ["secret_key", "aws_secret_access_key", "ec2_secret_key"],
        "no_log": True,
    },
    "aws_session_token": {
        "type": "str",
        "aliases": ["session_token", "aws_security_token", "security_token"],
        "no_log": True,
    },
    "max_attempts": {"type": "int", "default": DEFAULT_MAX_ATTEMPTS},
    "initial_backoff": {"type": "float", "default": DEFAULT_INITIAL_BACKOFF},
    "max_backoff": {"type": "float", "default": DEFAULT_MAX_BACKOFF},
    "connect_timeout": {"type": "float", "default": DEFAULT_CONNECT_TIMEOUT},
    "read_timeout": {"type": "float", "default": DEFAULT_READ_TIMEOUT},
}

_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)((?:aws_secret_access_key|aws_secret_key|secret_key|aws_session_token|session_token|"
    r"x-amz-security-token)[\"']?\s*[=:]\s*[\"']?)[^\s\"',;&]+"
)


class AwsError(Exception):
    """An AWS step failed. ``str(err)`` is the whole one-line message ("Failed to ...: <cause>").

    ``code`` is the API's error code (``UnauthorizedOperation``, ...) when there was an answer,
    ``cause`` the cause's text alone, ``attempts`` how many attempts were made.
    """

    def __init__(self, message, code=None, cause=None, attempts=1, operation=None, region=None):
        super(AwsError, self).__init__(message)
        self.code = code
        self.cause = cause if cause is not None else message
        self.attempts = attempts
        self.operation = operation
        self.region = region


class AwsSettingsError(AwsError):
    """A connection option has a value that cannot work (bad type, range, URL, credentials pair)."""


def argument_spec():
    """The connection options as an AnsibleModule argument_spec (environment variables are read by
    ``ConnectionSettings.from_options``, which a module calls with ``module.params``)."""
    spec = {}
    for name, option in OPTIONS.items():
        entry = {"type": option["type"]}
        for key in ("default", "aliases", "no_log"):
            if key in option:
                entry[key] = list(option[key]) if key == "aliases" else option[key]
        spec[name] = entry
    return spec


def _convert(name, kind, value):
    if kind == "str":
        return to_native(value)
    if isinstance(value, bool):
        raise AwsSettingsError("%s must be a number, got %r" % (name, value))
    try:
        return int(value) if kind == "int" else float(value)
    except (TypeError, ValueError):
        raise AwsSettingsError(
            "%s must be %s, got %r" % (name, "an integer" if kind == "int" else "a number", value)
        ) from None


@dataclass(frozen=True)
class ConnectionSettings:
    """Endpoint, credentials, retry budget and timeouts of AWS clients; validated when made."""

    endpoint_url: object = None
    aws_profile: object = None
    aws_access_key: object = None
    aws_secret_key: object = field(default=None, repr=False)
    aws_session_token: object = field(default=None, repr=False)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_backoff: float = DEFAULT_INITIAL_BACKOFF
    max_backoff: float = DEFAULT_MAX_BACKOFF
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT

    def __post_init__(self):
        if (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or self.max_attempts < 1
        ):
            raise AwsSettingsError("max_attempts must be at least 1, got %r" % (self.max_attempts,))
        for name in ("initial_backoff", "max_backoff"):
            value = getattr(self, name)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value < 0
            ):
                raise AwsSettingsError("%s must not be negative, got %r" % (name, value))
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise AwsSettingsError("%s must be positive, got %r" % (name, value))
        if self.endpoint_url:
            parsed = urlparse(str(self.endpoint_url))
            try:
                port_ok = parsed.port is None or parsed.port > 0
            except ValueError:  # not a number (a password with a "/" in it, say)
                port_ok = False
            if parsed.scheme not in ("http", "https") or not parsed.netloc or not port_ok:
                raise AwsSettingsError(
                    "endpoint_url must be an http:// or https:// URL, got %r"
                    % _redact(str(self.endpoint_url), self.secrets())
                )
        if bool(self.aws_access_key) != bool(self.aws_secret_key):
            raise AwsSettingsError("aws_access_key and aws_secret_key must be given together")
        if self.aws_access_key and self.aws_profile:
            raise AwsSettingsError("aws_profile and aws_access_key are mutually exclusive")

    @classmethod
    def from_options(cls, options, environ=None):
        """Settings from option values (a module's params, an inventory source's configuration).

        Per option: its value, else the first alias's that is set, else its environment variables
        (from ``environ``; none when None), else its default. Empty strings count as unset.
        """
        values = {}
        for name, option in OPTIONS.items():
            value = None
            for key in [name] + list(option.get("aliases", ())):
                if options.get(key) not in (None, ""):
                    value = options[key]
                    break
            if value is None and environ is not None:
                value = next((environ[e] for e in option.get("env", ()) if environ.get(e)), None)
            if value is None:
                value = option.get("default")
            if value is not None:
                values[name] = _convert(name, option["type"], value)
        return cls(**values)

    def __repr__(self):
        """The settings without the secret key, the session token, or a password in the endpoint URL."""
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("aws_secret_key", "aws_session_token"):
                value = "***" if value else value
            elif f.name == "endpoint_url" and value:
                value = _redact(to_native(value), self.secrets())
            shown.append("%s=%r" % (f.name, value))
        return "%s(%s)" % (type(self).__name__, ", ".join(shown))

    def as_dict(self):
        """The settings by option name (secrets included: for building another settings object)."""
        return dict((f.name, getattr(self, f.name)) for f in fields(self))

    def secrets(self):
        """The values that must never appear in an error text or a log."""
        return tuple(s for s in (self.aws_secret_key, self.aws_session_token) if s)


# ---- error texts ---------------------------------------------------------------------------------


def _redact(text, secrets=()):
    for secret in secrets:
        secret = to_native(secret)
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    text = _URL_PASSWORD.sub(r"\1***@", text)
    return _SECRET_ASSIGNMENT.sub(r"\1***", text)


def error_code(exc):
    """The API's error code of a botocore ClientError ("" for anything else)."""
    if HAS_BOTO3 and isinstance(exc, botocore.exceptions.ClientError):
        return to_native(exc.response.get("Error", {}).get("Code") or "")
    return ""


def error_text(exc, secrets=()):
    """One line for an exception: "Code: Message" for an API error, without secrets.

    ``secrets``: values to hide besides the patterns always hidden (a password in a URL, a secret
    key or session token written as ``name=value``); ``ConnectionSettings.secrets()`` gives them.
    """
    if HAS_BOTO3 and isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        code = err.get("Code") or "HTTP %s" % exc.response.get("ResponseMetadata", {}).get(
            "HTTPStatusCode", "?"
        )
        text = "%s: %s" % (code, err.get("Message") or to_native(exc))
    elif HAS_BOTO3 and isinstance(exc, botocore.exceptions.NoCredentialsError):
        text = (
            "%s (set aws_profile, or aws_access_key and aws_secret_key, or the AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY/AWS_PROFILE environment variables)" % to_native(exc)
        )
    else:
        text = to_native(exc) or type(exc).__name__
    text = " ".join(_redact(text, secrets).split())
    if len(text) > MAX_ERROR_TEXT:
        text = text[: MAX_ERROR_TEXT - 3] + "..."
    return text


def is_throttling(exc):
    """True for a throttling answer (RequestLimitExceeded, Throttling, ...)."""
    return error_code(exc) in THROTTLING_CODES


def is_retryable(exc):
    """Throttling, another retryable code, HTTP >= 500, or a connection error (not a TLS one)."""
    if not HAS_BOTO3:
        return False
    if isinstance(exc, botocore.exceptions.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return error_code(exc) in RETRYABLE_CODES or int(status) >= 500
    if isinstance(exc, botocore.exceptions.SSLError):
        return False
    return isinstance(exc, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError))


# ---- clients -------------------------------------------------------------------------------------


def _require():
    if not HAS_BOTO3:
        raise AwsError(
            "Failed to reach AWS: boto3 and botocore are required (pip install boto3): %s"
            % BOTO3_IMPORT_ERROR
        )
    if not HAS_TENACITY:
        raise AwsError(
            "Failed to reach AWS: tenacity is required (pip install tenacity): %s" % TENACITY_IMPORT_ERROR
        )


def session(settings, botocore_session=None):
    """A boto3 Session with the settings' credentials (boto3's own chain when none are given).

    ``botocore_session``: the botocore session to build it on (a new one when None).
    """
    _require()
    kwargs = {}
    if botocore_session is not None:
        kwargs["botocore_session"] = botocore_session
    if settings.aws_profile:
        kwargs["profile_name"] = settings.aws_profile
    if settings.aws_access_key:
        kwargs["aws_access_key_id"] = settings.aws_access_key
        kwargs["aws_secret_access_key"] = settings.aws_secret_key
        kwargs["aws_session_token"] = settings.aws_session_token or None
    try:
        return boto3.session.Session(**kwargs)
    except (botocore.exceptions.BotoCoreError, ValueError) as e:
        raise AwsError(
            "Failed to set up AWS credentials: %s" % error_text(e, settings.secrets()),
            cause=error_text(e, settings.secrets()),
        ) from None


def client(settings, service="ec2", region=None, aws_session=None, user_agent="fleetops"):
    """A client of ``service`` in ``region``: botocore's retries off, the settings' timeouts and endpoint."""
    _require()
    if aws_session is None:
        aws_session = session(settings)
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},  # call()'s budget is the whole budget
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        user_agent_extra=user_agent,
    )
    try:
        return aws_session.client(
            service, region_name=region, endpoint_url=settings.endpoint_url or None, config=config
        )
    except (botocore.exceptions.BotoCoreError, ValueError, TypeError) as e:
        cause = error_text(e, settings.secrets())
        raise AwsError(
            "Failed to create an %s client for %s: %s" % (service.upper(), region, cause),
            cause=cause,
            region=region,
        ) from None


# ---- retries -------------------------------------------------------------------------------------


def retrying(settings, on_retry=None, describe=""):
    """A tenacity.Retrying under the settings' budget; ``on_retry(line)`` hears of each failed attempt."""
    _require()

    def before_sleep(state):
        exc = state.outcome.exception()
        on_retry(
            "%s%s; attempt %d of %d failed, next in %.2fs"
            % (
                describe + ": " if describe else "",
                error_text(exc, settings.secrets()),
                state.attempt_number,
                settings.max_attempts,
                state.next_action.sleep if state.next_action else 0.0,
            )
        )

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(settings.max_attempts),
        wait=tenacity.wait_random_exponential(multiplier=settings.initial_backoff, max=settings.max_backoff),
        retry=tenacity.retry_if_exception(is_retryable),
        before_sleep=before_sleep if on_retry is not None else None,
        reraise=True,
    )


def call(settings, operation, region, func, service="ec2", on_retry=None):
    """``func()`` (one API request) under the retry budget; its answer, or an AwsError naming the call.

    ``on_retry(line)`` hears "ec2:<Operation> in <region>: <cause>; attempt n of N failed, next in
    Xs" before each wait.
    """
    what = "%s:%s in %s" % (service, operation, region)
    attempts = retrying(settings, on_retry=on_retry, describe=what)
    try:
        return attempts(func)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        count = attempts.statistics.get("attempt_number", 1)
        cause = error_text(e, settings.secrets())
        raise AwsError(
            "Failed to call %s%s: %s" % (what, " after %d attempts" % count if count > 1 else "", cause),
            code=error_code(e) or None,
            cause=cause,
            attempts=count,
            operation=operation,
            region=region,
        ) from None


def retry(settings, operation, region, service="ec2", on_retry=None):
    """Decorator: every call of the decorated function is ``call(settings, operation, region, ...)``."""

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return call(
                settings,
                operation,
                region,
                functools.partial(func, *args, **kwargs),
                service=service,
                on_retry=on_retry,
            )

        return wrapper

    return decorator
