"""Credentials inside environment values are digested in place; ordinary values are left alone."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import redact
from hypothesis import given, settings
from hypothesis import strategies as st

D = redact.digest


def legacy_digest(value: str) -> str:
    """The format units.redact has always written for a secret-looking name."""
    return "<redacted sha256:{}>".format(hashlib.sha256(value.encode("utf-8")).hexdigest()[:12])


def test_digest_format_is_unchanged() -> None:
    assert D("hunter2") == legacy_digest("hunter2") == "<redacted sha256:f52fbd32b2b3>"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DB_PASSWORD", "hunter2"),
        ("API_TOKEN", "postgres://a:b@c/d"),
        ("GITHUB_AUTH", "anything at all"),
        ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("private_key_pem", "-----BEGIN PRIVATE KEY-----"),
    ],
)
def test_secret_looking_names_digest_the_whole_value(name: str, value: str) -> None:
    assert redact.redact_value(name, value) == legacy_digest(value)


# (value, the secret(s) inside it, the expected text with {0}, {1} for the digests of those secrets)
INSIDE = [
    ("postgres://app:s3cret@db.internal:5432/app", ["s3cret"], "postgres://app:{0}@db.internal:5432/app"),
    (
        "postgresql://app:p@ss@w0rd@db/x?sslmode=require",
        ["p@ss@w0rd"],
        "postgresql://app:{0}@db/x?sslmode=require",
    ),
    ("mysql://root:hunter2@10.0.0.5:3306/prod", ["hunter2"], "mysql://root:{0}@10.0.0.5:3306/prod"),
    ("redis://:r3dis-pass@cache:6379/0", ["r3dis-pass"], "redis://:{0}@cache:6379/0"),
    (
        "rediss://default:Tok3n@redis.example.com:6380",
        ["Tok3n"],
        "rediss://default:{0}@redis.example.com:6380",
    ),
    ("amqp://guest:guestpw@rabbit:5672/%2F", ["guestpw"], "amqp://guest:{0}@rabbit:5672/%2F"),
    (
        "mongodb+srv://svc:Mong0Pw@cluster0.ab1cd.mongodb.net/?retryWrites=true&w=majority",
        ["Mong0Pw"],
        "mongodb+srv://svc:{0}@cluster0.ab1cd.mongodb.net/?retryWrites=true&w=majority",
    ),
    ("jdbc:mysql://app:pw123456@db:3306/x", ["pw123456"], "jdbc:mysql://app:{0}@db:3306/x"),
    (
        "jdbc:postgresql://db:5432/app?user=app&password=Sup3r!&ssl=true",
        ["Sup3r!"],
        "jdbc:postgresql://db:5432/app?user=app&password={0}&ssl=true",
    ),
    (
        "jdbc:sqlserver://db:1433;databaseName=app;user=sa;password=Str0ng;encrypt=true",
        ["Str0ng"],
        "jdbc:sqlserver://db:1433;databaseName=app;user=sa;password={0};encrypt=true",
    ),
    ("jdbc:oracle:thin:scott/tiger@//db:1521/ORCL", ["tiger"], "jdbc:oracle:thin:scott/{0}@//db:1521/ORCL"),
    (
        "Driver={ODBC Driver 18 for SQL Server};Server=tcp:db,1433;Uid=app;Pwd={se;cr}}et};Encrypt=yes",
        ["se;cr}}et"],
        "Driver={{ODBC Driver 18 for SQL Server}};Server=tcp:db,1433;Uid=app;Pwd={{{0}}};Encrypt=yes",
    ),
    ("Driver=x;Server=db;Uid=app;PWD=plainpw;", ["plainpw"], "Driver=x;Server=db;Uid=app;PWD={0};"),
    (
        "host=db port=5432 dbname=app user=app password='with space' sslmode=verify-full",
        ["with space"],
        "host=db port=5432 dbname=app user=app password='{0}' sslmode=verify-full",
    ),
    (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password="k4fka";',
        ["k4fka"],
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password="{0}";',
    ),
    (
        "https://bucket.s3.us-east-1.amazonaws.com/model.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20250101%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
        "&X-Amz-Security-Token=IQoJb3JpZ2luX2VjEJr&X-Amz-Signature=9f86d081884c7d659a2feaa0c55ad015",
        [
            "AKIAIOSFODNN7EXAMPLE%2F20250101%2Fus-east-1%2Fs3%2Faws4_request",
            "IQoJb3JpZ2luX2VjEJr",
            "9f86d081884c7d659a2feaa0c55ad015",
        ],
        "https://bucket.s3.us-east-1.amazonaws.com/model.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential={0}&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
        "&X-Amz-Security-Token={1}&X-Amz-Signature={2}",
    ),
    (
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2025-01-01&sp=r&sig=abc%2Bdef%3D",
        ["abc%2Bdef%3D"],
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2025-01-01&sp=r&sig={0}",
    ),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFy==;EndpointSuffix=core.windows.net",
        ["Zm9vYmFy=="],
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={0};EndpointSuffix=core.windows.net",
    ),
    (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc=",
        ["abc="],
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={0}",
    ),
    ("AKIAIOSFODNN7EXAMPLE", ["AKIAIOSFODNN7EXAMPLE"], "{0}"),
    (
        "AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"],
        "{0}:{1}",
    ),
    (
        '{"AccessKeyId": "ASIAY34FZKBOKMUTVV7A", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
        ["ASIAY34FZKBOKMUTVV7A", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"],
        '{{"AccessKeyId": "{0}", "SecretAccessKey": "{1}"}}',
    ),
    (
        "aws secret key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY for the nightly sync",
        ["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"],
        "aws secret key {0} for the nightly sync",
    ),
    (
        "-H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl' -v",
        ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"],
        "-H 'Authorization: Bearer {0}' -v",
    ),
    (
        "Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l",
        ["YWxhZGRpbjpvcGVuc2VzYW1l"],
        "Authorization: Basic {0}",
    ),
    ("authorization=token abcdef123456", ["abcdef123456"], "authorization=token {0}"),
    ("bearer sk-proj-0123456789abcdef", ["sk-proj-0123456789abcdef"], "bearer {0}"),
    (
        "--token=abc123 --password hunter2 --verbose",
        ["abc123", "hunter2"],
        "--token={0} --password {1} --verbose",
    ),
    (
        "https://x-access-token:ghs_abcdefghijklmnopqrstuvwxyz0123456789@github.com/o/r.git",
        ["ghs_abcdefghijklmnopqrstuvwxyz0123456789"],
        "https://x-access-token:{0}@github.com/o/r.git",
    ),
    (
        "https://ghp_abcdefghijklmnopqrstuvwxyz0123456789AB@github.com/o/r.git",
        ["ghp_abcdefghijklmnopqrstuvwxyz0123456789AB"],
        "https://{0}@github.com/o/r.git",
    ),
    ("PGPASSWORD=pgpw psql -h db", ["pgpw"], "PGPASSWORD={0} psql -h db"),
]


@pytest.mark.parametrize(("value", "secrets", "expected"), INSIDE, ids=[v[:40] for v, _, _ in INSIDE])
def test_credentials_inside_values_are_digested_in_place(
    value: str, secrets: list[str], expected: str
) -> None:
    out = redact.redact_value("DATABASE_URL", value)
    assert out == expected.format(*(D(s) for s in secrets))
    for secret in secrets:
        assert secret not in out
    assert redact.redact_value("DATABASE_URL", out) == out  # redacting twice changes nothing


NOT_SECRET = [
    ("UCX_MEM_MMAP_HOOK_MODE", "none"),
    ("UCX_RCACHE_MAX_UNRELEASED", "inf"),
    ("UCX_TLS", "rc,cuda_copy,cuda_ipc"),
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/opt/amazon/efa/lib"),
    ("ENDPOINT", "https://example.com/api/v1?page=2&sort=name"),
    ("REPO", "ssh://git@github.com/org/repo.git"),
    ("PROXY", "http://proxy.internal:3128/"),
    ("DB_HOST_URL", "postgres://app@db:5432/app"),
    ("NCCL_SOCKET_IFNAME", "^lo,docker0"),
    ("KUBELET_EXTRA_ARGS", "--node-labels=role=gpu --register-with-taints=nvidia.com/gpu=true:NoSchedule"),
    ("VLLM_ARGS", "--max-tokens=4096 --tensor-parallel-size 8"),
    ("OPTS", "bypass=1 compass=north keyboard=us"),
    ("SB_NAME", "SharedAccessKeyName=RootManageSharedAccessKey"),
    ("CONTACT", "mailto:oncall@example.com"),
    ("LISTEN", "tcp://[::1]:5432"),
    ("JAVA_OPTS", "-Xmx4g -Dfile.encoding=UTF-8"),
    ("GIT_SHA", "0123456789abcdef0123456789abcdef01234567"),
]


@pytest.mark.parametrize(("name", "value"), NOT_SECRET)
def test_ordinary_values_are_left_alone(name: str, value: str) -> None:
    assert redact.redact_value(name, value) == value


def test_redact_env() -> None:
    env = {
        "DATABASE_URL": "postgres://app:secret@db/x",
        "DB_PASSWORD": "hunter2",
        "UCX_MEM_MMAP_HOOK_MODE": "none",
        "PATH": "/usr/bin:/bin",
    }
    assert redact.redact_env(env) == {
        "DATABASE_URL": "postgres://app:{}@db/x".format(D("secret")),
        "DB_PASSWORD": legacy_digest("hunter2"),
        "UCX_MEM_MMAP_HOOK_MODE": "none",
        "PATH": "/usr/bin:/bin",
    }
    assert env["DATABASE_URL"] == "postgres://app:secret@db/x"  # the input is not changed


def test_equal_secrets_still_compare_equal_and_different_ones_differ() -> None:
    a = redact.redact_value("DATABASE_URL", "postgres://app:one@db/x")
    b = redact.redact_value("DATABASE_URL", "postgres://app:one@db/x")
    c = redact.redact_value("DATABASE_URL", "postgres://app:two@db/x")
    assert a == b != c


def test_values_that_are_not_text_are_returned_as_they_are() -> None:
    assert redact.redact_value("X", None) is None
    assert redact.redact_value("X", 5) == 5


def test_a_surrogate_escaped_value_is_digested_not_an_error() -> None:
    value = "postgres://app:p\udcff@db/x"  # a non-UTF-8 byte, decoded with surrogateescape
    assert redact.redact_value("DATABASE_URL", value) == "postgres://app:{}@db/x".format(D("p\udcff"))


SECRET_TEXT = st.text(
    alphabet=st.characters(categories=["L", "N"]) | st.sampled_from("!$%*+-._~"), min_size=6, max_size=40
)
TEMPLATES = [
    "postgres://svc:{s}@db.internal:5432/app",
    "https://api.example.com/v1?user=a&password={s}&x=1",
    "Server=db;Uid=app;Pwd={s};",
    "Authorization: Bearer {s}",
    "--api-key={s} --verbose",
    'client_secret="{s}"',
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TEMPLATES), SECRET_TEXT)
def test_a_generated_secret_never_survives(template: str, secret: str) -> None:
    out = redact.redact_value("SERVICE_CONFIG", template.format(s=secret))
    assert secret not in out
    assert D(secret) in out


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_gives_text(text: str) -> None:
    out = redact.redact_value("X", text)
    assert isinstance(out, str)
    assert (out == text) == (not redact.secret_spans(text))


def test_long_values_take_linear_time() -> None:
    start = time.perf_counter()
    for chunk in ("a", "=", "password=", "x://a:b@", "AKIA", "bearer ", "pwd={", '"password":"', "a.b-c_"):
        redact.redact_text(chunk * (50_000 // len(chunk)))
    assert time.perf_counter() - start < 5.0  # about 0.3 s on the dev machine; quadratic would be minutes


def test_the_patterns_compile_where_first_used_and_then_are_the_compiled_ones() -> None:
    """Compiling them costs each host ~2.4 ms of CPU on every scan; a scan whose units set no environment
    redacts nothing. Imported fresh (as a host does), none is compiled until a value is redacted."""
    code = (
        "import re, sys\n"
        "from ansible_collections.fleetops.node.plugins.module_utils import redact\n"
        "lazy = [v for v in vars(redact).values() if isinstance(v, redact._Pattern)]\n"
        "assert len(lazy) >= 11 and not any(isinstance(v, re.Pattern) for v in vars(redact).values())\n"
        "assert all(set(vars(p)) == {'_source'} for p in lazy), 'compiled at import'\n"
        "assert redact.redact_env({'A': 'x'}) == {'A': 'x'}\n"
        "assert all('finditer' in vars(p) or 'search' in vars(p) for p in lazy), 'not compiled on use'\n"
        "assert vars(redact._PAIR)['finditer'].__self__ is re.compile(*redact._PAIR._source)\n"
    )
    path = os.pathsep.join(p for p in sys.path if p)  # where this process finds the collection
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
