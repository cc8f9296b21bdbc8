"""Shared test setup: tests import their small reference helpers from this folder; shared fixtures."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# The MLflow client settings the tracker sets when the user has not: tests that create trackers restore them.
HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


@pytest.fixture
def restore_http_env():
    saved = {name: os.environ.get(name) for name in HTTP_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
