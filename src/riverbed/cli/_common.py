"""Pieces shared by the CLI's command groups."""

from __future__ import annotations

import argparse
from typing import Any

from riverbed.config import Config, load_config
from riverbed.errors import InvalidValueError

CHECKPOINTS_HELP = (
    "where checkpoints are: a path, file:///path or s3://bucket/prefix (default: "
    "RIVERBED_CHECKPOINTS, else riverbed.toml, else RIVERBED_HOME/checkpoints); with a "
    "bucket, results go to <checkpoints>/output/<name> too"
)


def positive_int(text: str) -> int:
    """An option's value that must be a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def config_of(args: argparse.Namespace) -> Config:
    """The configuration, with ``--checkpoints`` (where a command has it) over what it
    says."""
    from dataclasses import replace

    config = load_config()
    given = getattr(args, "checkpoints", None)
    return replace(config, checkpoints=given) if given else config


class Subcommands:
    """Adds subcommands that all accept the group's shared options, so they work before
    or after the subcommand (``control --json get k`` and ``control get k --json``)."""

    def __init__(self, action: Any, common: argparse.ArgumentParser) -> None:
        self._action = action
        self._common = common

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._action.add_parser(
            name, parents=[self._common], **kwargs
        )
        return parser


def shared_options(
    parser: argparse.ArgumentParser, *options: tuple[str, dict[str, Any]]
) -> argparse.ArgumentParser:
    """Add ``options`` to ``parser`` and return a parent parser carrying them for
    subcommands, with SUPPRESS defaults so an absent option there does not overwrite
    one given before the subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    for flag, kwargs in options:
        parser.add_argument(flag, **kwargs)
        common.add_argument(flag, **{**kwargs, "default": argparse.SUPPRESS})
    return common


class UsageError(InvalidValueError):
    """A command-line argument that cannot be used; the message says what to type."""


def print_json_rows(frame: Any) -> None:
    """A result frame's rows as JSON objects, one a line (``riverbed query --json`` of an
    aggregation or a join): values as the topic sinks write them (times as ISO 8601,
    TopK's pairs as a list of {value, count}, NaN as null)."""
    import json

    from riverbed.stream.sinks import plain

    for row in frame.to_dict("records"):
        print(json.dumps({k: plain(v) for k, v in row.items()}, default=str))
