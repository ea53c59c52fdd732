"""Reading the JSON and YAML files users give, with one-line errors naming the file."""

from __future__ import annotations

import json
from typing import Any

from workload.errors import ConfigError


def read_json(path: str, what: str) -> Any:
    """The parsed JSON of ``path``; ``what`` names the kind of file in errors ("system configuration")."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def read_yaml(path: str, what: str) -> Any:
    """The parsed YAML of ``path``; ``what`` names the kind of file in errors ("network configuration")."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
