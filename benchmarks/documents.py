"""Many files as one corpus, in stream mode (issue 18): a document break after each file
(what ``chargen train FOLDER`` does) against the files simply run together, at the same
steps, scored on documents neither saw, at their starts and in all.

Documents: ~4,000-character pieces (cut at blank lines) of two authors, Shakespeare
(corpora/shakespeare.txt) and Milton (the text of ``python -m benchmarks.finetune``: run
that first, or give its Brotli archive), shuffled together. 64 go to a training folder,
16 are held out. ``folder``: ``chargen train FOLDER`` (each file a document, ended by a
break). ``joined``: the same files concatenated into one file, ``chargen train FILE``.
Both with the same flags (1x256, fixed steps, fp32). Each model then reads the held-out
documents one after the other, its state carried (the folder's model with a break after
each, as it trained), and the loss is averaged over the first 100 and 400 characters of
every document and over all.

    python -m benchmarks.documents          # ~4 minutes on 2 cores
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import chargen
from benchmarks.common import OUT, ROOT, child_env, command_line
from chargen.corpus import DOCUMENT_END

DOC_CHARS = 4000


def pieces(text: str, n: int, rng: np.random.Generator) -> list[str]:
    """``n`` pieces of about DOC_CHARS, from random places, each cut at blank lines."""
    out = []
    for start in rng.choice(len(text) - 3 * DOC_CHARS, size=n, replace=False):
        a = text.find("\n\n", start) + 2
        b = text.find("\n\n", a + DOC_CHARS) + 1
        out.append(text[a:b])
    return out


def documents(milton: Path, seed: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    docs = pieces((ROOT / "corpora" / "shakespeare.txt").read_text(encoding="utf-8"), 40, rng)
    docs += pieces(milton.read_text(encoding="utf-8"), 40, rng)
    order = rng.permutation(len(docs))
    docs = [docs[i] for i in order]
    return docs[:64], docs[64:]


@torch.inference_mode()
def position_losses(run: Path, docs: list[str], breaks: bool) -> dict[str, float]:
    """Mean loss over the first 100 and 400 characters of each document and over all, the
    documents read in order with the state carried (a break after each where ``breaks``);
    the breaks themselves are not scored."""
    model = chargen.load(run, device="cpu")
    ids, position = [], []
    for doc in docs:
        ids += model.tokenizer.encode(doc).tolist()
        position += range(len(doc))
        if breaks:
            ids.append(DOCUMENT_END)
            position.append(-1)
    x = torch.tensor(ids[:-1]).unsqueeze(1)
    target, position = torch.tensor(ids[1:]), np.array(position[1:])
    losses, state = [], None
    for start in range(0, len(x), 512):
        logits, state = model.model(x[start : start + 512], state)
        losses.append(F.cross_entropy(logits[:, 0].float(), target[start : start + 512], reduction="none"))
    loss = torch.cat(losses).numpy()
    return {f"first {n}": float(loss[(position >= 0) & (position < n)].mean()) for n in (100, 400)} | {
        "all": float(loss[position >= 0].mean())}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--milton", type=Path, default=OUT / "finetune" / "data" / "train.txt",
                        help="the Milton text (python -m benchmarks.finetune makes it)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    if not args.milton.is_file():
        raise SystemExit(f"{args.milton} is missing: run python -m benchmarks.finetune first (it builds the Milton "
                         "text)")
    flags = ["--hidden", "256", "--steps", str(args.steps), "--eval-every", "100000", "--precision", "fp32",
             "--device", "cpu", "--mode", "stream", "--quiet", "--force"]
    env = child_env()
    print("| seed | corpus | first 100 chars | first 400 chars | all |\n| ---: | --- | ---: | ---: | ---: |")
    for seed in args.seeds:
        train_docs, held = documents(args.milton, seed)
        with tempfile.TemporaryDirectory() as tmp:
            folder, joined = Path(tmp) / "docs", Path(tmp) / "joined.txt"
            folder.mkdir()
            for i, doc in enumerate(train_docs):
                (folder / f"{i:03d}.txt").write_text(doc, encoding="utf-8")
            joined.write_text("".join(train_docs), encoding="utf-8")
            for name, text, breaks in (("folder", folder, True), ("joined", joined, False)):
                run = Path(tmp) / f"run-{name}"
                subprocess.run([sys.executable, "-m", "chargen", "train", str(text), "--out", str(run), "--seed",
                                str(seed), *flags], check=True, env=env, cwd=ROOT, capture_output=True)
                scores = position_losses(run, held, breaks)
                print(f"| {seed} | {name} | {scores['first 100']:.4f} | {scores['first 400']:.4f} | "
                      f"{scores['all']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
