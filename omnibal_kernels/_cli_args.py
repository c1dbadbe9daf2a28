"""Argument types of the command line: each reads one flag's text and refuses a value outside the flag's range
(argparse puts the flag's name before the message), so that no bad value reaches the library unnamed."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any, Callable, NoReturn, Optional

__all__ = ["OneLineParser", "finite_float", "fraction", "int_in", "non_negative_float", "positive_float"]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (the command, the flag, what is wrong)
    and exit status 2, like every other bad input of the command line."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog.split()[0]}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        # argparse drops a "--" given as a flag's value (``--efficiency=--``) and stores an empty list without
        # calling the flag's type: refused here, by name, like any other value the type would refuse.
        for token in sys.argv[1:] if args is None else args:
            if token == "--":
                break
            if token.startswith("--") and token.endswith("=--"):
                self.error(f"argument {token[:-3]}: expected one value, got '--'")
        return super().parse_known_args(args, namespace)


def finite_float(text: str) -> float:
    """A finite real number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A share in ``(0, 1]``."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number ``> 0``."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ``>= 0``."""
    value = finite_float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """The type of an integer flag in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {text}")
        return value

    return parse
