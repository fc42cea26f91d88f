"""How well ``chargen.memory.estimate`` predicts what training really takes.

Each configuration trains for a few steps, with a checkpoint, in a fresh process on a
synthetic text of the configuration's vocabulary; the process's peak resident memory
(VmHWM) less its resident memory just before ``train`` is the measured figure, set against
the estimate for the CPU. The estimate should be at or above the measurement (a refusal
errs on the safe side) and not far above it (it must not refuse what fits).

    python -m benchmarks.memory_estimate [--json PATH]      # a few minutes on 2 cores
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, command_line, write_json

# (layers, hidden, batch, bptt, vocabulary)
CONFIGS = [(1, 512, 32, 128, 75), (2, 1024, 64, 128, 75), (1, 256, 256, 256, 75), (1, 512, 32, 128, 3000),
           (1, 2048, 16, 64, 75), (3, 128, 128, 512, 200)]

CHILD = r"""
import json
import numpy as np
import chargen
from chargen import memory

layers, hidden, batch, bptt, vocab = {config!r}
rng = np.random.default_rng(0)
alphabet = [chr(c) for c in range(0x4E00, 0x4E00 + vocab)] if vocab > 95 else [chr(32 + c) for c in range(vocab)]
path = {text!r}
open(path, "w", encoding="utf-8").write("".join(rng.choice(alphabet, size=batch * (bptt + 1) * 12)))

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

corpus = chargen.load_corpus(path, mode="stream")
model_config = chargen.ModelConfig(vocab_size=corpus.tokenizer.vocab_size, hidden=hidden, layers=layers)
config = chargen.TrainConfig(batch_size=batch, bptt=bptt, steps=4, eval_every=2, sample_chars=0,
                             device="cpu", precision="fp32")
before = rss("VmRSS")
chargen.train(corpus, {run!r}, model_config, config)
need = memory.estimate(model_config, bptt, batch)
print(json.dumps({{"config": [layers, hidden, batch, bptt, vocab], "parameters": need.parameters,
                   "measured": rss("VmHWM") - before, "estimate": need.on(chargen.device.resolve_device("cpu"))}}))
"""


def measure(config: tuple[int, ...]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        code = CHILD.format(config=config, text=f"{tmp}/text.txt", run=f"{tmp}/run")
        # (run in the root: ``python -c`` puts the working folder first on the path, so this tree's chargen)
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print("| model | batch x bptt | vocabulary | parameters | measured (MB) | estimate (MB) | estimate / measured |")
    print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for config in CONFIGS:
        row = measure(config)
        rows.append(row)
        layers, hidden, batch, bptt, vocab = row["config"]
        print(f"| {layers}x{hidden} | {batch} x {bptt} | {vocab:,} | {row['parameters']:,} | "
              f"{row['measured'] / 2**20:,.0f} | {row['estimate'] / 2**20:,.0f} | "
              f"{row['estimate'] / row['measured']:.2f} |", flush=True)
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
