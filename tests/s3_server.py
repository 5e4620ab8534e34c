"""A real S3 server on loopback for the tests: moto's server (`python -m moto.server`, the dev extra's `moto`), as its
own process, speaking S3's HTTP API, with credentials checked (IAM on: a request signed with an unknown key or a
wrong secret is refused, as a real bucket refuses it).

    server = S3Server(log)                 # started, with one user allowed s3:* (server.env holds its keys)
    name = server.new_bucket()             # a fresh bucket
    server.objects(name, "run/")           # {key: bytes}, listed with boto3: what is really in the bucket
    server.stop()

Why moto in the default suite: it installs from PyPI in seconds (pure Python, the same package boto3's and s3fs's
own tests use), starts in under a second, and checks signatures. docs/storage.md says what it does not check.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

FREE_ACTIONS = 3  # moto lets this many requests through unsigned: the three that create the test's user below
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(FREE_ACTIONS)},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()
        self.env = self._user()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto's server exited: {self.log_path.read_text(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("moto's server did not start within 60 s")

    def _user(self) -> dict[str, str]:
        """A user allowed every S3 action, made with the server's unsigned requests; its keys as AWS_* variables."""
        import boto3  # moto's dependency: the tests' independent view of the bucket

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id="setup", aws_secret_access_key="setup")  # fmt: skip
        iam.create_user(UserName="finetune")
        key = iam.create_access_key(UserName="finetune")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="finetune", PolicyName="s3", PolicyDocument=json.dumps(policy))
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self):
        import boto3  # as above

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip

    def new_bucket(self) -> str:
        name = f"t-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object of the bucket under `prefix`, and its bytes (listed by boto3, not by finetune's code)."""
        found = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found |= {item["Key"]: item["Size"] for item in page.get("Contents", [])}
        return found

    def requests(self) -> list[str]:
        """The request lines the server logged so far ("GET /bucket/key HTTP/1.1")."""
        self._log.flush()
        return [line.split('"')[1] for line in self.log_path.read_text(errors="replace").splitlines() if '"' in line]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
