"""How the package says a bad value and quotes an exception in its one-line errors. Standard library
only, so the app can use it before (or without) loading torch."""

from typing import Any


class ConfigError(ValueError):
    """A bad config, said in one line that names the key and what it accepts."""


def bad(key: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid; accepted: {accepted}")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
