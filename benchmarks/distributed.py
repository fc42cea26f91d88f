"""torchrun on the CPU: 2 processes against 1, the same global batch and epochs; with
``--nodes``, also 2 simulated nodes (a torchrun agent each, one process each).

Trains the same model on the same text twice with the CLI: once in one process, once with
``torchrun --standalone --nproc_per_node=2`` (gloo; each process one thread, torchrun's
default, and half of the streams, or in lines mode every other item of each batch). Prints
the validation bpc of each and their ratio, and the training chars/s of each and their
ratio: Shakespeare in stream mode, the names list in lines mode. The simulated nodes meet
at a c10d rendezvous on 127.0.0.1, as two machines would at --rdzv-endpoint; their gloo
traffic goes through this machine's loopback, not a network.

    python -m benchmarks.distributed                 # ~4 min on 2 cores
    python -m benchmarks.distributed --modes lines
    python -m benchmarks.distributed --modes stream --nodes
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, child_env, command_line, free_port, listening, read_jsonl

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def run(command: list[str], out: Path, env: dict, nodes: int = 1) -> dict:
    if nodes == 1:
        subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:  # the same torchrun command on each node; node 0 hosts the rendezvous
        port = free_port()
        command = [*TORCHRUN, "--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"bench-{port}", *command]
        agents = []
        for _ in range(nodes):
            agents.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
            while not agents or not listening(port):
                time.sleep(0.05)
        if any(agent.wait() for agent in agents):
            raise RuntimeError(f"a node failed: {' '.join(command)}")
    summary = json.loads((out / "config.json").read_text())["summary"]
    last_val = [e for e in read_jsonl(out / "metrics.jsonl") if e["event"] == "val"][-1]
    return {"val_bpc": last_val["val_bpc"], "chars_per_s": summary["chars_seen"] / summary["train_seconds"],
            "seconds": summary["train_seconds"]}


CASES = {  # mode: (text, epochs)
    "stream": (ROOT / "corpora" / "shakespeare.txt", 1.0),
    "lines": (ROOT / "corpora" / "first_names.txt", 20.0),
}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--modes", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch (default 64)")
    parser.add_argument("--nodes", action="store_true", help="also 2 simulated nodes, one process each")
    args = parser.parse_args()
    env = child_env()
    print(f"1x{args.hidden} LSTM, global batch {args.batch_size}, fp32, {os.cpu_count()} cores\n")
    print("| text | run | val bpc | train chars/s | train time (s) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for mode in args.modes:
        text, epochs = CASES[mode]
        flags = ["--mode", mode, "--hidden", str(args.hidden), "--batch-size", str(args.batch_size), "--epochs",
                 str(epochs), "--eval-every", "1000000", "--precision", "fp32", "--device", "cpu", "--quiet",
                 "--force"]
        with tempfile.TemporaryDirectory() as tmp:
            one = run([sys.executable, "-m", "chargen", "train", str(text), "--out", f"{tmp}/one", *flags],
                      Path(tmp) / "one", env)
            two = run([*TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "chargen", "train", str(text), "--out",
                       f"{tmp}/two", *flags], Path(tmp) / "two", env)
            # (a machine each: one thread each, as torchrun sets for 2 processes on one machine, not for 1)
            nodes = run(["-m", "chargen", "train", str(text), "--out", f"{tmp}/nodes", *flags], Path(tmp) / "nodes",
                        child_env(OMP_NUM_THREADS="1"), nodes=2) if args.nodes else None
        name = f"{text.name} ({mode}, {epochs:g} epoch{'s' * (epochs != 1)})"
        print(f"| {name} | 1 process ({os.cpu_count()} threads) | {one['val_bpc']:.4f} | {one['chars_per_s']:,.0f} | "
              f"{one['seconds']:.0f} |")
        print(f"| {name} | torchrun, 2 processes (1 thread each) | {two['val_bpc']:.4f} | "
              f"{two['chars_per_s']:,.0f} | {two['seconds']:.0f} |")
        bpc_ratio, speed_ratio = two["val_bpc"] / one["val_bpc"], two["chars_per_s"] / one["chars_per_s"]
        print(f"| {name} | 2 processes / 1 | {bpc_ratio:.4f} | {speed_ratio:.2f} | |", flush=True)
        if nodes:
            print(f"| {name} | 2 simulated nodes (1 process, 1 thread each) | {nodes['val_bpc']:.4f} | "
                  f"{nodes['chars_per_s']:,.0f} | {nodes['seconds']:.0f} |")
            print(f"| {name} | 2 nodes / 1 process | {nodes['val_bpc'] / one['val_bpc']:.4f} | "
                  f"{nodes['chars_per_s'] / one['chars_per_s']:.2f} | |", flush=True)


if __name__ == "__main__":
    main()
