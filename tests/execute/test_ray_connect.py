"""Connecting to a Ray cluster: a cluster that refuses this client's token is named as such, with
how to give it the token, instead of a bare "cannot connect". Ray's native client reports the
refusal only in its log lines on file descriptor 2 and then raises a plain ConnectionError, so
the fake below does the same; the real refusal was seen with ``RAY_AUTH_MODE=token ray start``."""

from __future__ import annotations

import os
import sys
import types

import pytest

from patcher.errors import OperationFailed
from patcher.execute.ray_executor import RayExecutor


def _fake_ray(monkeypatch, native_line: bytes, exc: Exception):
    def init(**_):
        os.write(2, native_line)                 # as the C++ GCS client writes it
        raise exc
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)


def test_a_refused_token_is_named_with_the_fix(monkeypatch, capfd):
    _fake_ray(monkeypatch, b"[W gcs_client.cc:210] Failed to get cluster ID from GCS server: "
                           b"Unauthenticated: RPC error: InvalidAuthToken: Authentication token "
                           b"is missing or incorrect\n" * 3,
              ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"))
    with pytest.raises(OperationFailed) as err:
        RayExecutor("10.0.0.1:6379")._connect()
    message = str(err.value)
    assert "uses token authentication and refused this client" in message
    assert "RAY_AUTH_TOKEN" in message and "ray get-auth-token" in message
    assert "InvalidAuthToken" not in capfd.readouterr().err      # the retries' noise stays out


def test_a_cluster_that_is_not_there_keeps_its_own_message(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _fake_ray(monkeypatch, b"", ConnectionError("Could not find any running Ray instance."))
    with pytest.raises(OperationFailed, match="cannot connect to the Ray cluster at auto: Could "
                                              "not find any running Ray instance"):
        RayExecutor()._connect()
