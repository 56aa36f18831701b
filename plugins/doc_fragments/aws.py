# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The AWS connection options of the fleetops modules that call AWS (plugins/module_utils/aws.py's
    OPTIONS and argument_spec(); their environment variables are the fleetops.node.ec2 inventory
    plugin's)."""

    DOCUMENTATION = r"""
options:
  endpoint_url:
    description:
      - Use this endpoint instead of AWS's, for every API the module calls, for example a local emulator
        (moto). Default the
        environment variable C(AWS_ENDPOINT_URL_EC2), else C(AWS_ENDPOINT_URL).
    type: str
    aliases: [aws_endpoint_url, ec2_url]
  aws_profile:
    description: The named profile (shared credentials/config files) to use. Mutually exclusive with O(aws_access_key).
    type: str
    aliases: [profile, boto_profile]
  aws_access_key:
    description: The AWS access key ID. Requires O(aws_secret_key). Default boto3's own chain (environment, profile, role).
    type: str
    aliases: [access_key, aws_access_key_id, ec2_access_key]
  aws_secret_key:
    description: The AWS secret access key. Requires O(aws_access_key).
    type: str
    aliases: [secret_key, aws_secret_access_key, ec2_secret_key]
  aws_session_token:
    description: The AWS session token, for temporary credentials.
    type: str
    aliases: [session_token, aws_security_token, security_token]
  max_attempts:
    description: Attempts of one API call (throttling, HTTP 5xx and connection errors are retried).
    type: int
    default: 8
  initial_backoff:
    description: Seconds of the first wait between attempts (jittered, doubling).
    type: float
    default: 0.5
  max_backoff:
    description: The longest wait between attempts, in seconds.
    type: float
    default: 20.0
  connect_timeout:
    description: Seconds to wait for a connection.
    type: float
    default: 10.0
  read_timeout:
    description: Seconds to wait for an answer once connected.
    type: float
    default: 60.0
notes:
  - The connection options (O(endpoint_url), credentials, retries, timeouts) and their environment
    variables are the C(fleetops.node.ec2) inventory plugin's; AWX's Amazon Web Services credential sets
    C(AWS_ACCESS_KEY_ID) and C(AWS_SECRET_ACCESS_KEY), which boto3 reads.
requirements:
  - boto3
  - tenacity
"""
