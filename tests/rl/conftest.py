"""Fixtures every trainer test module shares: a tiny model directory and a data directory, one per module."""

import pytest

from tests.rl import tiny_run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return tiny_run.tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("data"))
