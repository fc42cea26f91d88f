"""The texts of the budget suite (``python -m benchmarks.suite``, issue 33): eight,
each split 90/10 into a training and a validation file, built from the shipped corpora and
from pinned package archives (checked against their SHA-256), never from the web at run
time. Fetch the archives once (PyPI and Debian are package registries):

    pip download Brotli==1.1.0 --no-deps --no-binary Brotli -d benchmarks/out/suite/sources
    pip download sentencepiece==0.2.0 pip==24.3.1 --no-deps --no-binary :all: -d benchmarks/out/suite/sources
    (cd benchmarks/out/suite/sources && apt-get download fortunes-ru=1.52-3.1 wamerican=2020.12.07-2)

- ``play``: the first 1,000,000 characters of corpora/shakespeare.txt (the plays, verse and
  prose; the text of ``benchmarks.budget``).
- ``prose``: three books of English prose from the Canterbury corpus and Project Gutenberg,
  as their packages ship them: *Alice's Adventures in Wonderland* and the Library of Congress
  report *lcet10* (``tests/testdata`` of Brotli 1.1.0), and Natsume's *Botchan* in English
  (``test/botchan.txt`` of sentencepiece 0.2.0); the Gutenberg headers and licences cut off.
- ``code``: Python source, the ``.py`` files of pip 24.3.1's source archive (pip and the
  libraries it vendors) in path order, whole files, the first 1,000,000 characters or so.
- ``cpp``: C++ source, held out from the rule's fitting: the ``.cc`` and ``.h`` files of
  sentencepiece 0.2.0's source archive in path order (its own code, then the protobuf-lite
  and other libraries it vendors), without the generated protocol buffers and the two
  Unicode tables, whole files, the first 1,000,000 characters or so.
- ``russian``: Russian prose, the UTF-8 files of Debian's fortunes-ru 1.52-3.1 (quotations,
  jokes and stories in Cyrillic) in name order, each entry a paragraph, about 1,000,000
  characters.
- ``short``: *Alice's Adventures in Wonderland* alone (as in ``prose``), about 150,000
  characters: one short book, where a model's parameters outnumber the text's characters and
  the size rule's ``PARAMS_PER_CHAR`` decides.
- ``list``: corpora/first_names.txt, one name a line, shuffled with a fixed seed before the
  split (its sorted order would leave only Y and Z names to validate on); lines mode.
- ``words``: held out from the rule's fitting, a second list as small as the names: 5,000
  words of Debian's wamerican 2020.12.07-2 (``/usr/share/dict/american-english``, without
  the possessives), shuffled with the same seed; lines mode.

    python -m benchmarks.suite_texts        # build them (once) and print their figures
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import OUT, ROOT, command_line, corpus_split
from chargen import Corpus, load_corpus

SIZE = 1_000_000
ARCHIVES = {  # file name: SHA-256
    "Brotli-1.1.0.tar.gz": "81de08ac11bcb85841e440c13611c00b67d3bf82698314928d0b676362546724",
    "sentencepiece-0.2.0.tar.gz": "a52c19171daaf2e697dc6cbe67684e0fa341b1248966f6aebb541de654d15843",
    "pip-24.3.1.tar.gz": "ebcb60557f2aefabc2e0f918751cd24ea0d56d8ec5445fe1807f1d2109660b99",
    "fortunes-ru_1.52-3.1_all.deb": "2dc76af9c0e02e2926d36f88dcb685bb171fab8677e553a6def41efe8a551cc6",
    "wamerican_2020.12.07-2_all.deb": "c8f8e2b2ad0d37bfdd41f0e40f1e4c8e5f907467d768a1d3698b164e9617f0b4",
}
WORDS = 5_000  # of the word list, for a list as small as the names


def archive(sources: Path, name: str) -> bytes:
    """A pinned archive's bytes, checked; a missing or different one stops the suite with how to fetch it."""
    path = sources / name
    if not path.is_file():
        raise SystemExit(f"{path} is missing; fetch the archives as python -m benchmarks.suite_texts --help says")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != ARCHIVES[name]:
        raise SystemExit(f"{path} is not the pinned archive (its SHA-256 differs); fetch it again")
    return data


def members(data: bytes, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The files of a .tar.gz whose names ``wanted`` accepts."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and wanted(m.name)}


def gutenberg_body(text: str) -> str:
    """A Project Gutenberg etext without its header and licence."""
    start = re.search(r"\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG[^\n]*\n", text)
    end = re.search(r"\n[^\n]*\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG", text)
    return text[start.end() if start else 0 : end.start() if end else len(text)]


def tidy(text: str) -> str:
    """LF line endings, no trailing spaces, runs of blank lines made one."""
    lines = [line.rstrip() for line in text.replace("\ufeff", "").replace("\r\n", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def play(sources: Path) -> str:
    return (ROOT / "corpora" / "shakespeare.txt").read_text(encoding="utf-8")[:SIZE]


def canterbury(sources: Path, *names: str) -> list[str]:
    """Books of the Canterbury corpus in Brotli's test data, in name order."""
    books = members(archive(sources, "Brotli-1.1.0.tar.gz"), lambda name: name.endswith(tuple(f"/{n}" for n in names)))
    return [books[name].decode("latin-1") for name in sorted(books)]


def prose(sources: Path) -> str:
    spm = members(archive(sources, "sentencepiece-0.2.0.tar.gz"), lambda name: name.endswith("/botchan.txt"))
    botchan = [gutenberg_body(text.decode("utf-8")) for text in spm.values()]
    books = canterbury(sources, "alice29.txt", "lcet10.txt") + botchan
    return "\n\n".join(tidy(book) for book in books)


def short(sources: Path) -> str:
    return tidy(canterbury(sources, "alice29.txt")[0])


def code(sources: Path) -> str:
    return whole_files(members(archive(sources, "pip-24.3.1.tar.gz"), lambda name: name.endswith(".py")))


def whole_files(files: dict[str, bytes]) -> str:
    """Source files in path order, each whole and tidied, until the text reaches SIZE characters."""
    text = ""
    for name in sorted(files):
        if len(text) >= SIZE:
            break
        text += tidy(files[name].decode("utf-8")) + "\n"
    return text


def cpp(sources: Path) -> str:
    generated = ("/builtin_pb/", "/normalization_rule.h", "/unicode_script_map.h")
    files = members(archive(sources, "sentencepiece-0.2.0.tar.gz"),
                    lambda name: name.endswith((".cc", ".h")) and not any(part in name for part in generated))
    return whole_files(files)


def deb_members(deb: bytes, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The files of a Debian package whose names ``wanted`` accepts, in name order."""
    data = deb[deb.index(b"data.tar"):]  # (an ar archive: the data member is a tar, found by its name)
    header, body = data[:60], data[60:]
    size = int(header[48:58])
    with tarfile.open(fileobj=io.BytesIO(body[:size])) as tar:
        found = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and wanted(m.name)}
    return dict(sorted(found.items()))


def russian(sources: Path) -> str:
    files = deb_members(archive(sources, "fortunes-ru_1.52-3.1_all.deb"),
                        lambda name: "/fortunes/ru/" in name and not name.endswith(".dat"))
    entries = []
    for data in files.values():
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # (a KOI8-R twin of a .u8 file)
            continue
        entries += [tidy(entry) for entry in text.split("\n%\n") if entry.strip()]
        if sum(map(len, entries)) >= SIZE:
            break
    return "\n".join(entries)


def names(sources: Path) -> str:
    items = (ROOT / "corpora" / "first_names.txt").read_text(encoding="utf-8").splitlines()
    random.Random(33).shuffle(items)
    return "\n".join(items) + "\n"


def words(sources: Path) -> str:
    deb = archive(sources, "wamerican_2020.12.07-2_all.deb")
    files = deb_members(deb, lambda name: name.endswith("/american-english"))
    items = [word for word in next(iter(files.values())).decode("utf-8").splitlines() if not word.endswith("'s")]
    random.Random(33).shuffle(items)
    return "\n".join(items[:WORDS]) + "\n"


TEXTS: dict[str, Callable[[Path], str]] = {"play": play, "prose": prose, "code": code, "cpp": cpp, "russian": russian,
                                           "list": names, "short": short, "words": words}


def split(kind: str, out: Path) -> tuple[Path, Path]:
    """OUT/data/KIND/train.txt and val.txt (made once), cut 90/10 at a line break."""
    return corpus_split(out / "data" / kind, lambda: TEXTS[kind](out / "sources"), at_line=True)


def suite_corpus(kind: str, out: Path = OUT / "suite") -> Corpus:
    """The suite's ``kind`` text as a corpus, split as ``split`` splits it."""
    train_file, val_file = split(kind, out)
    return load_corpus(train_file, val_path=val_file)


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--out", type=Path, default=OUT / "suite")
    args = parser.parse_args()
    print("| text | training chars | validation chars | distinct chars | lines |\n| --- | ---: | ---: | ---: | ---: |")
    for kind in TEXTS:
        train, val = (path.read_text(encoding="utf-8") for path in split(kind, args.out))
        print(f"| {kind} | {len(train):,} | {len(val):,} | {len(set(train + val))} | "
              f"{(train + val).count(chr(10)):,} |")


if __name__ == "__main__":
    main()
