"""module_utils/aws.py: settings, client factory, retries and error texts, against a real moto_server.

No boto3 mocks: moto_server is a real HTTP EC2 endpoint on 127.0.0.1 and fleetops_lab.ec2sim.Ec2Proxy sits in
front of it to throttle (503 RequestLimitExceeded) and deny (403 UnauthorizedOperation), as in
test_ec2_inventory.py; a small loopback server stands for an endpoint that echoes request headers.
"""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.inventory import ec2 as ec2_plugin
from ansible_collections.fleetops.node.plugins.module_utils import aws

from fleetops_lab.ec2sim import Ec2Proxy, MotoServer, free_port, launch_many
from tests.paths import REPO

REGION = "us-east-1"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLETOKEN0123456789abcdef"
RETRY_LINE = re.compile(
    r"^ec2:DescribeInstances in us-east-1: RequestLimitExceeded: Request limit exceeded\.; "
    r"attempt (\d+) of (\d+) failed, next in (\d+\.\d+)s$"
)


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with MotoServer() as server:
        launch_many(server.url, REGION, 2)
        yield server.url


@pytest.fixture
def proxy(moto: str) -> Iterator[Ec2Proxy]:
    with Ec2Proxy(moto, inject_events=False) as p:
        yield p


def _settings(url: str, **kw: Any) -> Any:
    values: dict[str, Any] = {
        "endpoint_url": url,
        "aws_access_key": "testing",
        "aws_secret_key": "testing",
        "max_attempts": 4,
        "initial_backoff": 0.02,
        "max_backoff": 0.1,
    }
    values.update(kw)
    return aws.ConnectionSettings(**values)


# ---- retries ----------------------------------------------------------------------------------


def test_throttling_is_retried_with_jittered_exponential_backoff(proxy: Ec2Proxy) -> None:
    settings = _settings(proxy.url, max_attempts=4, initial_backoff=0.04, max_backoff=0.1)
    client = aws.client(settings, "ec2", REGION)
    proxy.throttle(3, {"DescribeInstances"})
    lines: list[str] = []
    answer = aws.call(settings, "DescribeInstances", REGION, client.describe_instances, on_retry=lines.append)
    assert len([i for r in answer["Reservations"] for i in r["Instances"]]) == 2
    assert proxy.throttled == {"DescribeInstances": 3}
    assert proxy.calls == {"DescribeInstances": 4}  # botocore's own retries are off: these 4 are ours
    assert len(lines) == 3, lines
    for n, line in enumerate(lines, start=1):
        match = RETRY_LINE.match(line)
        assert match, line
        assert (int(match[1]), int(match[2])) == (n, 4)
        # full jitter: a random wait below initial_backoff x 2^(n-1), and never above max_backoff
        assert 0.0 <= float(match[3]) <= min(0.1, 0.04 * 2 ** (n - 1)) + 0.005, line


def test_a_budget_that_runs_out_is_one_error_naming_the_call(proxy: Ec2Proxy) -> None:
    settings = _settings(proxy.url, max_attempts=3)
    client = aws.client(settings, "ec2", REGION)
    proxy.throttle(1000)
    with pytest.raises(aws.AwsError) as failed:
        aws.call(settings, "DescribeInstances", REGION, client.describe_instances)
    assert str(failed.value) == (
        "Failed to call ec2:DescribeInstances in us-east-1 after 3 attempts: "
        "RequestLimitExceeded: Request limit exceeded."
    )
    assert (failed.value.code, failed.value.attempts) == ("RequestLimitExceeded", 3)
    assert failed.value.cause == "RequestLimitExceeded: Request limit exceeded."
    assert proxy.calls == {"DescribeInstances": 3}


def test_the_retry_decorator_retries_each_call(proxy: Ec2Proxy) -> None:
    settings = _settings(proxy.url)
    client = aws.client(settings, "ec2", REGION)

    @aws.retry(settings, "DescribeTags", REGION)
    def tags(**kwargs: Any) -> Any:
        return client.describe_tags(**kwargs)

    proxy.throttle(2, {"DescribeTags"})
    assert "Tags" in tags(MaxResults=5)
    assert proxy.throttled == {"DescribeTags": 2}
    assert proxy.calls == {"DescribeTags": 3}


def test_a_refusal_is_not_retried(proxy: Ec2Proxy) -> None:
    settings = _settings(proxy.url)
    client = aws.client(settings, "ec2", REGION)
    proxy.deny({"DescribeInstances"})
    with pytest.raises(aws.AwsError) as failed:
        aws.call(settings, "DescribeInstances", REGION, client.describe_instances)
    assert str(failed.value) == (
        "Failed to call ec2:DescribeInstances in us-east-1: "
        "UnauthorizedOperation: You are not authorized to perform this operation."
    )
    assert (failed.value.code, failed.value.attempts) == ("UnauthorizedOperation", 1)
    assert proxy.calls == {"DescribeInstances": 1}


def test_an_unreachable_endpoint_is_retried_then_named() -> None:
    settings = _settings(f"http://127.0.0.1:{free_port()}", max_attempts=2, connect_timeout=2.0)
    client = aws.client(settings, "ec2", REGION)
    with pytest.raises(aws.AwsError) as failed:
        aws.call(settings, "DescribeInstances", REGION, client.describe_instances)
    assert str(failed.value).startswith(
        "Failed to call ec2:DescribeInstances in us-east-1 after 2 attempts: Could not connect to the endpoint URL"
    )
    assert failed.value.code is None


# ---- error texts: one line, no secret ---------------------------------------------------------


class _EchoHeaders(BaseHTTPRequestHandler):
    """An endpoint (a misconfigured proxy, an emulator) whose error message echoes the request's headers."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        echoed = " ".join(f"{k}={v}" for k, v in self.headers.items())
        body = (
            "<Response><Errors><Error><Code>AuthFailure</Code><Message>rejected:\n"
            f"{echoed}</Message></Error></Errors><RequestID>1</RequestID></Response>"
        ).encode()
        self.send_response(401)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHeaders)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_error_texts_carry_no_secret(echo: str) -> None:
    settings = _settings(echo, aws_access_key="AKIAEXAMPLE", aws_secret_key=SECRET, aws_session_token=TOKEN)
    client = aws.client(settings, "ec2", REGION)
    with pytest.raises(Exception) as raw:  # the session token really went out, and came back
        client.describe_instances()
    assert TOKEN in str(raw.value)
    with pytest.raises(aws.AwsError) as failed:
        aws.call(settings, "DescribeInstances", REGION, client.describe_instances)
    text = str(failed.value)
    assert text.startswith("Failed to call ec2:DescribeInstances in us-east-1: AuthFailure: rejected: ")
    assert "X-Amz-Security-Token=***" in text and "\n" not in text
    assert TOKEN not in text and SECRET not in text
    assert SECRET not in repr(settings) and TOKEN not in repr(settings)

    # a password in the endpoint URL: botocore repeats the URL in its connection errors
    port, password = free_port(), "Pa55-w0rd_in.the~url"
    settings = _settings(f"http://user:{password}@127.0.0.1:{port}", max_attempts=1)
    with pytest.raises(Exception) as raw:
        aws.client(settings, "ec2", REGION).describe_instances()
    assert password in str(raw.value)
    assert (
        aws.error_text(raw.value)
        == f'Could not connect to the endpoint URL: "http://user:***@127.0.0.1:{port}/"'
    )
    assert password not in repr(settings)
    with pytest.raises(aws.AwsError) as failed:
        aws.call(
            settings, "DescribeInstances", REGION, aws.client(settings, "ec2", REGION).describe_instances
        )
    assert password not in str(failed.value) and "user:***@" in str(failed.value)
    # a secret with a "/" in a URL is not a URL (botocore would echo a part of it): refused, not echoed
    with pytest.raises(aws.AwsSettingsError) as refused:
        _settings(f"http://user:{SECRET}@127.0.0.1:{port}", aws_secret_key=SECRET)
    assert "endpoint_url must be an http:// or https:// URL" in str(refused.value)
    assert SECRET[:8] not in str(refused.value)
    # a secret written as name=value, in any exception's text
    assert aws.error_text(ValueError(f"bad aws_secret_access_key={SECRET}\nsee docs")) == (
        "bad aws_secret_access_key=*** see docs"
    )


# ---- settings -----------------------------------------------------------------------------------


def test_options_resolve_value_alias_environment_default() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:2", "AWS_ENDPOINT_URL_EC2": ""}
    s = aws.ConnectionSettings.from_options(
        {"ec2_url": "http://127.0.0.1:1", "max_attempts": "3"}, environ=env
    )
    assert (s.endpoint_url, s.max_attempts, s.initial_backoff) == ("http://127.0.0.1:1", 3, 0.5)
    assert aws.ConnectionSettings.from_options({}, environ=env).endpoint_url == "http://127.0.0.1:2"
    env["AWS_ENDPOINT_URL_EC2"] = "http://127.0.0.1:3"
    assert (
        aws.ConnectionSettings.from_options({"endpoint_url": ""}, environ=env).endpoint_url
        == "http://127.0.0.1:3"
    )
    assert aws.ConnectionSettings.from_options({}, environ=None).endpoint_url is None
    s = aws.ConnectionSettings.from_options({"access_key": "AK", "aws_secret_access_key": "SK"})
    assert (s.aws_access_key, s.aws_secret_key, s.secrets()) == ("AK", "SK", ("SK",))
    defaults = aws.ConnectionSettings()
    assert (defaults.max_attempts, defaults.max_backoff, defaults.connect_timeout, defaults.read_timeout) == (
        8,
        20.0,
        10.0,
        60.0,
    )
    assert aws.ConnectionSettings.from_options(s.as_dict()) == s


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be at least 1, got 0"),
        ({"max_attempts": "many"}, "max_attempts must be an integer, got 'many'"),
        ({"initial_backoff": "nan"}, "initial_backoff must not be negative, got nan"),
        ({"max_backoff": -1}, "max_backoff must not be negative"),
        ({"read_timeout": "inf"}, "read_timeout must be positive, got inf"),
        ({"connect_timeout": 0}, "connect_timeout must be positive"),
        ({"endpoint_url": "127.0.0.1:5000"}, "endpoint_url must be an http:// or https:// URL"),
        ({"aws_access_key": "AK"}, "aws_access_key and aws_secret_key must be given together"),
        (
            {"profile": "p", "access_key": "AK", "secret_key": "SK"},
            "aws_profile and aws_access_key are mutually",
        ),
    ],
)
def test_options_that_cannot_work_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(aws.AwsSettingsError) as refused:
        aws.ConnectionSettings.from_options(options)
    assert message in str(refused.value)


def test_the_inventory_plugin_documents_exactly_these_options() -> None:
    """The plugin's DOCUMENTATION (a literal Ansible reads) states module_utils/aws.py's options as they are."""
    documented = yaml.safe_load(ec2_plugin.DOCUMENTATION)["options"]
    for name, option in aws.OPTIONS.items():
        doc = documented[name]
        assert doc["type"] == option["type"], name
        assert doc.get("default") == option.get("default"), name
        assert doc.get("aliases", []) == option.get("aliases", []), name
        assert [e["name"] for e in doc.get("env", [])] == option.get("env", []), name
    spec = aws.argument_spec()
    assert spec["aws_secret_key"]["no_log"] and spec["max_attempts"] == {"type": "int", "default": 8}


def test_retryable_and_throttling_codes() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError, SSLError

    def answer(code: str, status: int) -> ClientError:
        return ClientError(
            {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "X"
        )

    for code in ("RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled"):
        assert aws.is_throttling(answer(code, 400)) and aws.is_retryable(answer(code, 400)), code
    assert aws.is_retryable(answer("Whatever", 503)) and not aws.is_throttling(answer("Whatever", 503))
    assert not aws.is_retryable(answer("InvalidInstanceID.NotFound", 400))
    assert aws.is_retryable(EndpointConnectionError(endpoint_url="http://x"))
    assert not aws.is_retryable(SSLError(endpoint_url="https://x", error="bad cert"))
    assert not aws.is_retryable(ValueError("x"))
    assert math.isclose(aws.DEFAULT_INITIAL_BACKOFF, 0.5)


# ---- target side: importable without boto3, botocore, tenacity; Python 3.9 syntax ---------------

_WITHOUT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("boto3", "botocore", "tenacity"):
            raise ImportError("no " + name)
sys.meta_path.insert(0, Block())
from ansible_collections.fleetops.node.plugins.module_utils import aws
assert not aws.HAS_BOTO3 and not aws.HAS_TENACITY and aws.BOTO3_IMPORT_ERROR
s = aws.ConnectionSettings.from_options({"max_attempts": 2})
try:
    aws.client(s, "ec2", "us-east-1")
except aws.AwsError as e:
    print(e)
"""


def test_importable_without_boto3_or_tenacity() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "collections"), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Failed to reach AWS: boto3 and botocore are required (pip install boto3)")


def test_source_is_python_3_9_syntax() -> None:
    source = (REPO / "plugins" / "module_utils" / "aws.py").read_text()
    ast.parse(source, feature_version=(3, 9))  # SyntaxError for match statements, except*, ...
