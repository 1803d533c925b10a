"""ml_collections config files with `--config.a.b=value` overrides, for an argparse CLI.

A config file is a Python file with `get_config()` (or `get_config(arg)`, reached by
`path.py:arg`, as in big_vision) returning an `ml_collections.ConfigDict`.

Why not `ml_collections.config_flags`: it is built on absl flags, which own `sys.argv` parsing and
do not compose with the argparse subcommands of `dil-jax`. The override syntax here is the same
(`--config.optim.learning_rate=1e-4`, `--config.model.num_lower_layers 4`), the config is locked
first so a misspelt key is an error, and each value is parsed by the type of the field it replaces
(ConfigDict then refuses a value that does not cast, e.g. a string for an int).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from dil_jax.errors import DilJaxError
from dil_jax.train.config_rules import renamed_key_message

OVERRIDE_PREFIX = "--config."


class ConfigFileError(DilJaxError, ValueError):
    """A config file or override is invalid; the message names the file or key."""


def load_config_file(spec: str | os.PathLike) -> ml_collections.ConfigDict:
    """Runs `get_config()` of `path.py` or `get_config(arg)` of `path.py:arg`."""
    spec = str(spec)
    path, _, arg = spec.partition(".py:")
    path = path if path.endswith(".py") else path + ".py"
    if not Path(path).is_file():
        raise ConfigFileError(f"config file not found: {path}")
    module_spec = importlib.util.spec_from_file_location(f"_dil_config_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ConfigFileError(f"{path}, line {error.lineno}: not valid Python: {error.msg}"
                              ) from None
    if not hasattr(module, "get_config"):
        raise ConfigFileError(f"{path} has no get_config()")
    if arg and not inspect.signature(module.get_config).parameters:
        raise ConfigFileError(f"{spec}: {path}'s get_config() takes no argument, got {arg!r}; "
                              f"use {path} without ':{arg}'")
    config = module.get_config(arg) if arg else module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigFileError(f"{path}: get_config() returned {type(config).__name__}, "
                              "expected ml_collections.ConfigDict")
    return config


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Separates `--config.key=value` / `--config.key value` pairs from the other arguments."""
    rest: list[str] = []
    overrides: list[tuple[str, str]] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(OVERRIDE_PREFIX):
            key, eq, value = arg[len(OVERRIDE_PREFIX):].partition("=")
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigFileError(f"{arg} needs a value (--config.{key}=VALUE)")
                value = args[i + 1]
                i += 1
            if not key:
                raise ConfigFileError(f"empty key in {arg!r}")
            overrides.append((key, value))
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def type_name(value: object) -> str:
    """How a message names the type a field wants ("a float (a number such as 3e-05)")."""
    if isinstance(value, bool):
        return "a boolean (true/false)"
    if isinstance(value, int):
        return f"an integer (such as {value})"
    if isinstance(value, float):
        return f"a float (a number such as {value:g})"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} (such as {list(value)!r})"
    return f"a {type(value).__name__}"


def parse_value(text: str, current: object) -> object:
    """Parses `text` by the type of the value it replaces.

    str fields take the text as is (so `--config.model.checkpoint=1e-3` stays a string); bools
    take true/false/1/0/yes/no; None fields and numbers/tuples/lists go through
    `ast.literal_eval`, falling back to the raw string for a None field.
    """
    if isinstance(current, str):
        return text
    if isinstance(current, bool):
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigFileError(f"expected a boolean (true/false), got {text!r}")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if current is None:
            return text
        raise ConfigFileError(f"cannot parse {text!r} as {type_name(current)}") from None
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    return value


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Sequence[tuple[str, str]]) -> ml_collections.ConfigDict:
    """Sets each dotted key on a locked copy of `config`; unknown keys raise ConfigFileError."""
    config = ml_collections.ConfigDict(config)  # a copy: the caller's config is left alone
    config.lock()
    for key, text in overrides:
        *parents, leaf = key.split(".")
        node = config
        for index, name in enumerate(parents):
            if name not in node or not isinstance(node[name], ml_collections.ConfigDict):
                raise ConfigFileError(f"--config.{key}: no section "
                                      f"{'.'.join(parents[:index + 1])!r} in the config")
            node = node[name]
        if leaf not in node and renamed_key_message(key):
            raise ConfigFileError(f"--config.{key}: {renamed_key_message(key)}")
        if leaf not in node:
            raise ConfigFileError(f"--config.{key}: unknown key; {'.'.join(parents) or 'config'} "
                                  f"has {sorted(node.keys())}")
        if isinstance(node[leaf], ml_collections.ConfigDict):
            raise ConfigFileError(f"--config.{key} is a section; override its fields instead")
        # Every message names the key and the value as typed, whatever went wrong.
        try:
            value = parse_value(text, node[leaf])
        except ConfigFileError as error:
            raise ConfigFileError(f"--config.{key}={text}: {error}") from None
        try:
            node[leaf] = value
        except TypeError:
            raise ConfigFileError(
                f"--config.{key}={text}: expected {type_name(node[leaf])}, got "
                f"{type(value).__name__} {value!r}") from None
    return config


def load_config(spec: str | os.PathLike,
                overrides: Sequence[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
    """A config file with overrides applied, locked (no new keys)."""
    return apply_overrides(load_config_file(spec), overrides)
