"""Hostile files: random bytes, invalid UTF-8, NUL bytes, one enormous line, mixed line
endings and huge vocabularies, fed to the corpus reader, the tokenizer and a short training
run. Each case must either train (2 steps, a checkpoint, a sample) or stop with a
``ChargenError`` (the CLI's one-line message); anything else is a crash.

    python -m benchmarks.fuzz --cases 1000      # about 15 s on 2 cores

``tests/test_fuzz.py`` runs the same cases, fewer of them.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chargen
from benchmarks.common import command_line
from chargen import ChargenError, ModelConfig, TrainConfig
from chargen.tokenizer import MAX_VOCAB

NEWLINES = st.sampled_from(["\n", "\r\n", "\r", "\n\n", "\x85", "\u2028"])


def _valid_code_points(n: int, start: int = 0x100) -> str:
    """``n`` distinct code points that UTF-8 can carry (no surrogates)."""
    out, c = [], start
    while len(out) < n:
        if not 0xD800 <= c <= 0xDFFF:
            out.append(chr(c))
        c += 1
    return "".join(out)


@st.composite
def hostile_files(draw) -> tuple[bytes, str, str]:
    """(file bytes, --errors policy, --mode) for one case."""
    kind = draw(st.sampled_from(["bytes", "text", "broken_utf8", "nul", "long_line", "vocab", "lines"]))
    if kind == "bytes":
        data = draw(st.binary(max_size=4000))
    elif kind == "text":
        parts = draw(st.lists(st.tuples(st.text(max_size=80), NEWLINES), max_size=60))
        data = "".join(a + b for a, b in parts).encode("utf-8", "surrogatepass")
    elif kind == "broken_utf8":
        text = draw(st.text(min_size=1, max_size=2000)).encode("utf-8", "surrogatepass")
        cut = draw(st.integers(0, len(text)))
        data = text[:cut] + draw(st.binary(min_size=1, max_size=4).filter(lambda b: b[0] >= 0x80)) + text[cut:]
    elif kind == "nul":
        data = draw(st.text(alphabet="ab\x00\n ", min_size=1, max_size=3000)).encode()
    elif kind == "long_line":
        unit = draw(st.text(min_size=1, max_size=8).filter(lambda t: "\n" not in t))
        data = (unit * (draw(st.integers(1, 200_000)) // len(unit) + 1)).encode("utf-8", "surrogatepass")
    elif kind == "vocab":
        n = draw(st.sampled_from([300, 5_000, MAX_VOCAB - 4, MAX_VOCAB + 1, 100_000]))
        data = (_valid_code_points(n) * 2).encode("utf-8")
    else:  # a list of short items, some empty, mixed endings
        items = draw(st.lists(st.text(max_size=20), min_size=0, max_size=300))
        data = "".join(item + draw(NEWLINES) for item in items).encode("utf-8", "surrogatepass")
    errors = draw(st.sampled_from(["strict", "replace", "ignore"]))
    mode = draw(st.sampled_from(["auto", "auto", "stream", "lines"]))
    return data, errors, mode


def try_file(data: bytes, errors: str, mode: str, work: Path) -> str:
    """"trained" or "refused: <the message's gist>"; any exception other than ChargenError
    propagates (a crash)."""
    path = work / "case.txt"
    path.write_bytes(data)
    try:
        corpus = chargen.load_corpus(path, errors=errors, mode=mode)
        model = ModelConfig(vocab_size=1, embedding=8, hidden=16, layers=1, dropout=0.0)
        config = TrainConfig(batch_size=2, base_batch_size=2, bptt=8, steps=2, eval_every=2, log_every=1,
                             sample_chars=20, warmup_steps=1, device="cpu", precision="fp32")
        result = chargen.train(corpus, work / "run", model, config, force=True)
        chargen.load(work / "run").generate_batch("", 10, num_samples=2, seed=0)
        assert result.step == 2
        return "trained"
    except ChargenError as e:
        message = str(e)
        assert message and "\n" not in message and "Traceback" not in message, message
        gist = re.sub(r"0x[0-9a-fA-F]+|\S*case\.txt\S*|(?<![-\w])\d[\d,.]*|'[^']*'", "#", message)
        return "refused: " + gist[:90]


def run_cases(n: int, work: Path, seed: int | None = None) -> Counter:
    """Run ``n`` hypothesis cases; returns how many trained and how many were refused."""
    outcomes: Counter = Counter()

    @settings(max_examples=n, deadline=None, database=None, derandomize=seed is not None,
              suppress_health_check=list(HealthCheck))
    @given(hostile_files())
    def case(drawn: tuple[bytes, str, str]) -> None:
        outcomes[try_file(*drawn, work)] += 1

    case()
    return outcomes


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--cases", type=int, default=1000)
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_cases(args.cases, Path(tmp))  # a crash raises, with hypothesis's minimal example
    total = sum(outcomes.values())
    refused = {k: v for k, v in outcomes.items() if k != "trained"}
    print(f"\n{total} cases in {time.perf_counter() - start:.0f} s (hypothesis may stop short of --cases "
          "when it has no new inputs to try)\n")
    print("| outcome | cases |")
    print("| --- | ---: |")
    print(f"| trained (2 steps, checkpoint, sample) | {outcomes['trained']} |")
    print(f"| refused with a clear one-line error | {sum(refused.values())} |")
    print("| crashed (any other exception) | 0 |")
    print("\n| refusal (numbers, names and bytes as #) | cases |")
    print("| --- | ---: |")
    for gist, count in sorted(refused.items(), key=lambda kv: -kv[1]):
        print(f"| {gist.removeprefix('refused: ')} | {count} |")


if __name__ == "__main__":
    main()
