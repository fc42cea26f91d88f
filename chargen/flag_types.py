"""What the command line's flags take: each type turns a word into a checked value, or into
argparse's one-line error naming the flag."""

from __future__ import annotations

import argparse
import math

from .checks import MAX_SEED


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def whole_number(text: str) -> int:
    if (value := integer(text)) < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive_int(text: str) -> int:
    if (value := integer(text)) <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def seed(text: str) -> int:
    if not 0 <= (value := integer(text)) <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be 0 to {MAX_SEED}, not {value}")
    return value


def resume_mode(text: str) -> str:
    if text not in ("yes", "auto"):  # (a file name after --resume: it takes one word, auto, or none)
        raise argparse.ArgumentTypeError(f"--resume takes no value or auto, not {text!r}: put the text file before "
                                         "--resume, or write --resume auto")
    return text
