"""Tests for hub.commands.common: flag, config file and default precedence."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hub.commands.common import (
    add_config_arg,
    add_data_args,
    config_from_args,
    data_dir_from_args,
    fail,
    store_from_args,
)
from hub.config import ConfigError
from hub.core.errors import BadRequest


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_data_args(parser)
    add_config_arg(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    args = parse()
    assert args.data is None and args.store is None and args.config is None
    assert data_dir_from_args(args) == Path("agora-data")
    assert config_from_args(args).storage.store is None


def test_flag_over_file_over_default(tmp_path: Path) -> None:
    config = tmp_path / "agora.toml"
    config.write_text('[storage]\ndata = "/srv/agora"\nstore = "sqlite:///srv/a.db"\n')
    assert data_dir_from_args(parse("--config", str(config))) == Path("/srv/agora")
    args = parse("--config", str(config), "--data", str(tmp_path), "--store", "sqlite://")
    assert data_dir_from_args(args) == tmp_path
    assert config_from_args(args).storage.store == "sqlite://"


def test_bad_config_file(tmp_path: Path) -> None:
    config = tmp_path / "agora.toml"
    config.write_text("[storage]\nstore = 1\n")
    with pytest.raises(ConfigError, match=r"storage\.store"):
        config_from_args(parse("--config", str(config)))


async def test_store_from_args(tmp_path: Path) -> None:
    async with store_from_args(parse("--data", str(tmp_path / "d"))) as store:
        assert await store.workspaces() == []
    assert (tmp_path / "d").is_dir()


def test_store_from_args_bad_url(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="scheme"):
        store_from_args(parse("--data", str(tmp_path), "--store", "mongodb://x"))


def test_fail_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail("demo", BadRequest("two\nlines")) == 2
    assert fail("demo", "plain", code=1) == 1
    assert capsys.readouterr().err == ("agora demo: error: two lines\nagora demo: error: plain\n")
