"""Fitting the model to the machine and the time: which size, and how much regularisation.

With ``--max-time`` and no ``--hidden``, ``--layers`` or ``--dropout``, the run's model is
chosen here. A short speed probe times a training step of each candidate size on this
machine, device and precision, from the smallest up; a size's training speed times the
budget is the characters C it can train on, and the rule takes the largest size that gets
at least ``CHARS_PER_PARAM`` characters per parameter P in at least ``MIN_STEPS`` steps,
and no more parameters than ``PARAMS_PER_CHAR`` per character of the text. A bigger model
learns more per character but sees fewer of them. The cap was 4 until a short text showed it
wrong: on Alice alone (134,000 training characters) at 411 s, 2x512, 25 parameters a
character, scored 1.3166 with dropout 0.6 where the cap held the run to 1x256 (1.3684;
``python -m benchmarks.suite --texts short``, benchmarks/suite.md); on prose for 30 minutes
2x512 at 4.5 beat 1x512 by 0.05. 32 keeps 2x512 there with a margin; the next rung (2x1024,
97 a character of that text) is unmeasured. In the sweep, 1x512 beat 1x256 where it
got 3.3 characters per parameter (bf16, 137 s: about 980 steps), and lost to it by 0.05 nats
where it got 1.8 (fp32 under the AVX2 cap); the line sits between. The steps: in the suite
at 60 s under the AVX2 cap, 1x256 on 7-9 characters per parameter but 620-680 steps lost to
1x128 (1,700-1,800 steps) on all four texts that are not lists, by 0.03 to 0.15 nats; 1x512
at 570-810 steps natively was a toss-up against 1x256 (won two, lost three, by up to 0.06);
at 980 and more it won (the sweep). The line sits between, and moves with the text's bits
too, by their square root (``steps_line``). Each rung of the ladder has
about 3.5 times the parameters and a third of the speed, so C/P falls about tenfold from one
rung to the next. The line moves with how predictable the text is (``size_line``): a
character of source code, which compresses to half the bits of one of Shakespeare, pays a
bigger model sooner. The probe stops at the first size below a line, or when the next one would
take more than ``PROBE_SHARE`` of the budget to time; it is counted in the budget.

Dropout and weight decay follow the run's exposure (``regularisation``): its epochs times
the model's parameters per character of the text, the characters counted as the size line
counts them (a predictable text is memorised sooner). A run of little exposure never meets a
character often enough to memorise it, and dropout only slows its learning; a big model on
a small text for many epochs memorises, and dropout is what keeps its validation loss
falling. A small model many epochs past a big text needs its first dropout too: there the
epochs count for more than the parameters (the repeats, ``regularisation``). The peak
learning rate follows the exposure too (``base_lr_for``): twice the usual below the exposure
that gets dropout, counted by characters, where a bigger step only learns sooner. Whoever
gives ``--dropout``, ``--weight-decay`` or ``--base-lr`` gets that.

The constants come from the sweep of ``python -m benchmarks.budget`` (benchmarks/README.md,
"How good at a budget"): fixed sizes against each other at equal wall time, natively and as an AVX2-only
CPU sees it; dropout's rise past the first measurements from ``python -m benchmarks.suite`` (benchmarks/suite.md,
five kinds of text).
"""

from __future__ import annotations

import bz2
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from .memory import parameter_count
from .model import CharLSTM, ModelConfig
from .schedule import BatchScaling

# (layers, hidden), smallest first; each about three times the parameters of the last.
LADDER = ((1, 128), (1, 256), (1, 512), (2, 512), (2, 1024), (3, 1024))
CHARS_PER_PARAM = 2.5  # the least training characters per parameter for a size to be chosen
MIN_STEPS = 800  # ... and the fewest updates (steps of the run's batch), at REFERENCE_BITS (``steps_line``)
PARAMS_PER_CHAR = 32.0  # the most parameters per character of the training text
PROBE_SHARE = 0.03  # of the budget, at most, for timing the candidates
PROBE_STEPS = 2  # timed steps per candidate (the fastest counts), after one that warms up the kernels
# The line in CHARS_PER_PARAM was read on Shakespeare, whose characters bz2 compresses to
# REFERENCE_BITS each; a text of b bits a character draws it at CHARS_PER_PARAM x b /
# REFERENCE_BITS, the ratio held within LINE_SCALE (the texts measured: 0.53-1.08).
REFERENCE_BITS = 2.3
LINE_SCALE = (0.5, 1.25)
SAMPLE_CHARS = 900_000  # of the text, compressed to measure it: one bz2 block, in SAMPLE_PIECES
SAMPLE_PIECES = 8
# Dropout and weight decay by the run's exposure: its epochs times the model's parameters
# per character of the text, the characters counted by how much they carry (the text's size
# line against CHARS_PER_PARAM; see ``regularisation``). None below LITTLE_EXPOSURE; there
# DROPOUT and weight decay WEIGHT_DECAY, and DROPOUT_PER_DOUBLING more dropout for every
# doubling of the exposure past RISE_EXPOSURE, up to HELD_DROPOUT; held there until
# RISE_AGAIN_EXPOSURE, then rising at the same slope again, up to MAX_DROPOUT; that second rise
# counts no more than PEAK_EPOCHS epochs (a tiny text's runs peak before, however long they go on).
LITTLE_EXPOSURE = 8.0
# ... or, below it, from REPEATS_EXPOSURE repeats: the epochs times the square root of the
# parameters per character, counted by the bits like the exposure (a small model many epochs
# past its text). At equal steps (6e-3; two seeds where two figures; benchmarks/suite.md,
# "The first dropout by the repeats"), 0.1 against none, by the repeats: 1x512 on Python for
# 650 steps (5.5) +0.006 and +0.013 nats; 1x256 on Russian, 1,900 steps (4.8), +0.007; on the
# play, 2,000 (5.6), -0.000 and -0.008; on Python, 1,400 (6.4), -0.012 and +0.004; on prose,
# 1,950 (7.8), -0.008 and -0.014; on Python, 1,650 (7.6), -0.014 and -0.019; 1x128 on the
# play, 5,300 (8.4), -0.013; on Python, 4,600 (12), -0.058. Counted by the exposure alone,
# 1x128's 3.0 and 4.4 won where 1x512's 6.5 lost: where dropout starts, the epochs count for
# more than the parameters.
REPEATS_EXPOSURE = 7.0
RISE_EXPOSURE = 12.0
DROPOUT = 0.1
DROPOUT_PER_DOUBLING = 0.1
HELD_DROPOUT = 0.4
RISE_AGAIN_EXPOSURE = 250.0
MAX_DROPOUT = 0.6
PEAK_EPOCHS = 50.0
WEIGHT_DECAY = 0.01
# ... and none for a model with fewer training characters per parameter than this in its run
# (below the size rule's CHARS_PER_PARAM: a size chosen by the rule, refitted a little under
# it, still needs its dropout), scaled like the line with the text's bits.
NO_DROPOUT_CHARS_PER_PARAM = 1.5
# The peak learning rate at the base batch where --base-lr is not given: BASE_LR, and
# LITTLE_EXPOSURE_LR below LITTLE_EXPOSURE, counted by characters (see ``base_lr_for``).
BASE_LR = BatchScaling.base_lr  # 3e-3
LITTLE_EXPOSURE_LR = 2 * BASE_LR


@dataclass(frozen=True)
class Regularisation:
    dropout: float
    weight_decay: float
    note: str = ""  # why none where the exposure calls for some, how it was counted, or how near the first dropout
    exposure: float = field(default=0.0, compare=False)  # what it was fitted to (see ``regularisation``)


def regularisation(epochs: float, params: int, text_chars: int, line: float = CHARS_PER_PARAM) -> Regularisation:
    """Dropout and weight decay for a run that will see ``epochs`` passes over a text of
    ``text_chars`` characters, with a model of ``params`` parameters, on a text whose size
    line (``size_line``) is ``line``.

    What decides is the exposure, epochs x params / text characters: a model starts to
    memorise its text after a number of epochs that grows with the text it has per
    parameter. In the sweep (benchmarks/README.md, "How good at a budget"), without dropout,
    validation loss turned up after about 7 epochs for 1x512 (1.36 parameters per character
    of the text) and after about 18 for 1x256 (0.39): at an exposure of 7-10 both times.
    Dropout 0.1 lost to none where the planned exposure was 5 or less (by 0.01-0.04 nats) and
    won at 8.7 and at 14-18 (by 0.01 and 0.07). Past that it needs more (the suite,
    "python -m benchmarks.suite", benchmarks/suite.md), but not before an exposure of
    RISE_EXPOSURE: at 18-31 every text did best at or below 0.2, where a rise from 8 gave
    0.22-0.3. 1x512 on a play at 411 s (exposure 23): 1.5073 with 0.1, 1.4836 with 0.2,
    1.4884 with 0.3; Python at 411 s (28): 1.0966 with 0.2, 1.0975 with 0.28; at equal steps,
    two seeds each, prose at 3,400 steps (31): 1.4128 with 0.2, 1.4269 with 0.25, 1.4253 with
    0.3; Russian at 3,200 (18.5): 1.3769 with 0.1, 1.3955 with 0.26. The rise stops at 0.4:
    1x128 on a list of names at 60 s (exposure 245-355) scored 1.8765, 1.8809, 1.8631 and
    1.8803 with 0.2 to 0.5; 2x512 on the play for 30 minutes (143) 1.4589 with 0.4, 1.4651
    with 0.5 and 1.4872 with 0.3, which half the slope would have given it. It holds there
    until an exposure of RISE_AGAIN_EXPOSURE and then rises again: on a short text (Alice
    alone, 134,000 characters) at 411 s, 2x512 at an exposure of about 1,500 scored 1.3482,
    1.3351, 1.3166 and 1.3628 with 0.4, 0.5, 0.6 and 0.7 (0.7 still falling at the end), and
    1x512 at 1,600 1.3702, 1.3596 and 1.4329 with 0.4, 0.6 and 0.8; 1x512 under the AVX2 cap
    at about 500 (an EPYC) 1.3610, 1.3459 and 1.3575 with 0.43, 0.5 and 0.6, 0.43 turning up
    after half its steps. The names at 355 (0.4 now, 131 epochs counted as 50; 0.4 beat 0.5 by
    0.017 and 0.3 by 0.018: the noise of a 3,620-character validation text) and the play at
    143 hold. Not met before PEAK_EPOCHS: the names far past their text (exposure 5,000 and
    19,000) did better with 0.45 than the 0.6 given (by 0.009 and 0.025): they peak in their
    first 12,000 steps at any budget. Runs that far past their text peak at 11-50 epochs, the
    weights kept are the peak's, and so the second rise counts the exposure of PEAK_EPOCHS
    epochs at most: the names' 0.6 becomes 0.48 (1.8652 and 1.8658 at 411 s and 30 minutes,
    within 0.01 of 0.45). A second list, 5,000 words (1x512, 30 parameters a character), at
    411 s: 2.1164 with 0.6, 2.1250 with 0.45 (its best at epoch 27 and 11); 50 of its epochs
    still call for 0.6, and so do the short book's. The first rise counts every epoch: a small
    model far past a big text holds at 0.4. Not fitted on, Python at 50 (1x512 for 8,000
    steps): 1.0919 with 0.36, 1.0961 with 0.3 (the rule's 0.31 now), 1.1181 with 0.2; 2x512 on
    the play at 1,700 steps (29): 1.4916 with 0.22 (now), 1.4950 with 0.28 (before).
    Texts differ at one exposure (prose at 411 s, exposure 50, did best with 0.2: 1.3974
    against 1.4074 with 0.35), and seeds by as much (prose at 3,400 steps with 0.2: 1.4003 and
    1.4252).

    A predictable text is memorised sooner: its characters are counted by how much they carry,
    as the size line counts them (exposure x CHARS_PER_PARAM / ``line``: x1.9 for C++ at 1.22
    bits a character, x1.6 for Python at 1.44, about x1 for the play, prose and Russian). 1x256
    for 3,300 steps at an exposure of 6 (under the old count, no dropout): on C++ 1.4618 with
    0.1 against 1.5474 with none (timed, 137 s); held out, on Python at equal steps, 1.1790
    against 1.2150; on the play, 1.5630 against 1.5727 (one run each).

    Below an exposure of LITTLE_EXPOSURE the first dropout comes with the repeats (see
    REPEATS_EXPOSURE).

    None either for a model too big for its run, one that will see fewer than
    NO_DROPOUT_CHARS_PER_PARAM training characters per parameter: it is far from memorising
    anything. 2x512 at 411 s saw 0.7 and 1.2 and lost with dropout 0.1, by 0.039 and 0.024, at
    exposures of 10 and 17; on a faster host it saw 2.4 (exposure 31) and won with 0.3 by 0.083
    (1.4798 against 1.5632; the line was the size rule's 2.5 then, and a refit had crossed it)."""
    scale = CHARS_PER_PARAM / line
    exposure = by_characters(epochs, params, text_chars) * scale
    repeats = epochs * math.sqrt(params / max(1, text_chars)) * scale
    if exposure < LITTLE_EXPOSURE and repeats < REPEATS_EXPOSURE:  # (the note: how near the first dropout it is)
        return Regularisation(0.0, 0.0, f"by its repeats: {repeats:.3g}, under {REPEATS_EXPOSURE:g}", exposure)
    seen, least = epochs * text_chars / max(1, params), NO_DROPOUT_CHARS_PER_PARAM / scale
    if seen < least:
        return Regularisation(0.0, 0.0, f"none: {seen:.2g} training characters per parameter, below {least:.2g}",
                              exposure)
    first = min(HELD_DROPOUT, DROPOUT + DROPOUT_PER_DOUBLING * math.log2(max(1.0, exposure / RISE_EXPOSURE)))
    peaked = exposure * min(1.0, PEAK_EPOCHS / max(epochs, 1e-9))  # (the exposure up to PEAK_EPOCHS)
    again = DROPOUT_PER_DOUBLING * math.log2(max(1.0, peaked / RISE_AGAIN_EXPOSURE))
    counted = (f"past {RISE_AGAIN_EXPOSURE:g} it counts {PEAK_EPOCHS:g} of the epochs: {peaked:.3g}"
               if peaked < exposure and exposure > RISE_AGAIN_EXPOSURE else
               f"by its repeats: {repeats:.3g}, from {REPEATS_EXPOSURE:g}" if exposure < LITTLE_EXPOSURE else "")
    return Regularisation(round(min(MAX_DROPOUT, first + again), 2), WEIGHT_DECAY, counted, exposure)


def base_lr_for(epochs: float, params: int, text_chars: int) -> float:
    """The peak learning rate of AdamW at the base batch for a run of ``epochs`` with
    ``params`` parameters on ``text_chars`` characters, where ``--base-lr`` is not given:
    twice BASE_LR below an exposure of LITTLE_EXPOSURE counted by characters (not by the
    bits, as the dropout's is), where the run is too short to memorise its text and a bigger
    step only learns sooner. At 137 s under the AVX2 cap (fp32), 1x256 (about 2,000 steps,
    exposure 3-6, no dropout) scored 0.025-0.075 nats better with 6e-3 than with 3e-3 on the
    play, prose and Russian, 0.002 on Python; 1x128 on Russian (5,500 steps, 3) 0.019; with
    dropout 0.1 on C++ (2.8 by characters, 5.3 counted by its bits) 1.4902 against 1.5811;
    1x512 on Python at 60 s natively (4.1, 6.5 counted) 1.2000 against 1.3024. Past it the
    larger step memorises sooner: natively, 1x256 on the play at exposure 10-13 peaked at
    1.6107 with 6e-3 against 1.5678 (3e-3), and 1x512 at 12 did best with 3e-3 (0.018
    ahead of 6e-3; Russian at 10, 0.037 behind). ``python -m chargen train TEXT --val-file
    VAL --max-time 137 --hidden H --layers 1 --dropout 0 --base-lr L``, benchmarks/suite.md."""
    return LITTLE_EXPOSURE_LR if by_characters(epochs, params, text_chars) < LITTLE_EXPOSURE else BASE_LR


def by_characters(epochs: float, params: int, text_chars: int) -> float:
    """A run's exposure counted by characters: epochs x parameters per character of the text
    (``base_lr_for``'s; ``regularisation`` counts the characters by their bits besides)."""
    return epochs * params / max(1, text_chars)


def probe_speed(config: ModelConfig, batch_size: int, bptt: int, device: torch.device,
                dtype: torch.dtype | None, steps: int = PROBE_STEPS) -> float:
    """Training characters per second of a model of ``config`` on ``device``: one step to
    warm up, then ``steps`` timed one by one, each a forward, backward, clip and AdamW
    update on random ids. The fastest step counts: other work on the machine only ever
    slows a step down, and one disturbed step would otherwise halve the speed of a size
    and choose a smaller model for the whole run. The caller's torch RNG is left as it was."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = CharLSTM(config).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(config.vocab_size, (bptt + 1, batch_size), device=device)
        fastest = math.inf
        for step in range(steps + 1):
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logits, _ = model(ids[:-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            synchronize(device)
            if step > 0:  # (the first warms up the kernels)
                fastest = min(fastest, time.perf_counter() - start)
    return batch_size * bptt / max(1e-9, fastest)


def bits_per_char(ids: np.ndarray) -> float:
    """How predictable a text is: the bits a character of it takes, compressed by bz2, on
    SAMPLE_CHARS of it at most (SAMPLE_PIECES stretches spread over a longer text; bz2 reads
    the sample as one block, about 0.06 s on a CPU)."""
    if len(ids) > SAMPLE_CHARS:
        piece = SAMPLE_CHARS // SAMPLE_PIECES
        starts = np.linspace(0, len(ids) - piece, SAMPLE_PIECES).astype(np.int64)
        ids = np.concatenate([ids[start : start + piece] for start in starts])
    if len(ids) == 0:
        return REFERENCE_BITS
    most = int(ids.max())
    symbols = np.asarray(ids).astype(np.uint8 if most < 256 else np.uint16 if most < 65536 else np.uint32)
    return 8 * len(bz2.compress(symbols.tobytes(), 9)) / len(ids)


def size_line(bits: float) -> float:
    """The least training characters per parameter for a size to be chosen, on a text of
    ``bits`` a character (``bits_per_char``). At 411 s on a Xeon (bf16), 2x512 against
    1x512 at the same time (benchmarks/suite.md): on Python (1.44 bits) 2x512 won on 2.2
    characters per parameter, by 0.018; on C++ (1.22, held out from the fitting) by 0.047;
    on Shakespeare (2.32) the two tied on 2.3; on Russian (2.48) 2x512 lost on 1.9, by 0.093.
    Under the line: on Python 2x512 lost on 1.45 (250 s), by 0.021; on C++ it won on 1.0
    (220 s), by 0.023: there the line is cautious."""
    low, high = LINE_SCALE
    return CHARS_PER_PARAM * min(high, max(low, bits / REFERENCE_BITS))


def steps_line(line: float) -> float:
    """The fewest steps for a size to be chosen on a text whose size line is ``line``
    (``size_line``): MIN_STEPS at the reference, moved by the square root of the size line's
    scale. On the code texts 1x512 beat 1x256 natively at 60 s on 650-770 steps (Python:
    three pairs, by 0.019-0.024; C++ by 0.010) and lost to it under the AVX2 cap at 137 s on
    517-530 (by 0.037 and 0.022; benchmarks/suite.md, "The step line by the bits"): their
    lines, 632 and 584, fall between. The line scaled as the size line is (500, 424) would
    have taken the losers; on the prose-like texts it stays within 784-831. Timed with it, in
    the four cells where it moved the choice (the code texts at 60 s, natively and under the
    cap) the new choice won, by 0.018-0.066."""
    return MIN_STEPS * math.sqrt(line / CHARS_PER_PARAM)


def counting(bits: float) -> str:
    """How ``regularisation`` counts the characters of a text of ``bits`` a character, said."""
    return f"its characters counted x{CHARS_PER_PARAM / size_line(bits):.2g} for {bits:.2f} bits a character"


def probe_config(config: ModelConfig, text_chars: int, line: float = CHARS_PER_PARAM) -> ModelConfig:
    """The model the probe times for a size: with dropout (DROPOUT; its cost does not depend
    on the rate) where the rule would give the size some at the size line, so that the probe
    times the steps the run will take. Dropout between two layers costs 2x512 10-13% of a
    step (bf16 on a Xeon: 190-197 ms, 212-215 with it; ``python -m benchmarks.probe_drift
    --dropout-cost 2x512``), and the probe that timed it
    without promised 2x512 2.5-2.8 training characters per parameter at 411 s on three
    texts, where the runs trained on 1.94-2.34 (``python -m benchmarks.probe_drift``,
    benchmarks/suite.md). At the size line (``line`` characters per parameter) a size sees
    ``line`` x its parameters per character of the text epochs; a dropout given
    (``config.dropout``) is timed as given."""
    if config.dropout is not None:
        return config
    per_char = params(config) / max(1, text_chars)
    at_line = regularisation(line * per_char, params(config), text_chars, line)
    return replace(config, dropout=DROPOUT if at_line.dropout > 0 else 0.0)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Probed:
    config: ModelConfig
    chars_per_s: float

    @property
    def name(self) -> str:
        return f"{self.config.layers}x{self.config.hidden}"


@dataclass(frozen=True)
class SizeChoice:
    """The size chosen, what the probe measured, and why."""

    config: ModelConfig  # dropout not yet set: see ``regularisation``
    probed: tuple[Probed, ...]
    seconds: float  # the probe's own time
    chars: float  # training characters the chosen size can see in the budget
    reason: str


params = parameter_count  # (the model's parameters, counted without building it)


def choose_size(probe: Callable[[ModelConfig], float], seconds: float, train_chars: int, base: ModelConfig,
                step_chars: int, most_chars: float = math.inf,
                ladder: tuple[tuple[int, int], ...] = LADDER, line: float = CHARS_PER_PARAM) -> SizeChoice:
    """The largest size of ``ladder`` that gets ``line`` characters per parameter and
    ``steps_line(line)`` steps (of ``step_chars`` characters) in ``seconds`` of training (at the speed
    ``probe`` measures) without exceeding PARAMS_PER_CHAR parameters per character of the
    text; the smallest if none does.
    ``base`` gives the vocabulary and embedding; a plan of ``most_chars`` caps what any
    size can see. Sizes are timed from the smallest up, and
    no longer once one falls below the line or the next would take more than PROBE_SHARE
    of ``seconds`` to time: its steps (of ``step_chars`` characters) are guessed from the
    last size's speed, by parameters. The share counts from the end of the first timing,
    which also pays torch's one-time set-up (about a second on a CPU)."""
    start, probed, allowance = time.perf_counter(), [], PROBE_SHARE * seconds
    chosen, limit, stopped, after_first = None, PARAMS_PER_CHAR * train_chars, "", 0.0
    for layers, hidden in ladder:
        config = replace(base, layers=layers, hidden=hidden)
        if probed:
            last = probed[-1]
            guess = (PROBE_STEPS + 1) * step_chars / last.chars_per_s * params(config) / params(last.config)
            if params(config) > limit or time.perf_counter() - after_first + guess > allowance:
                stopped = "too big for the text" if params(config) > limit else "too slow to time in the budget"
                break
        probed.append(Probed(config, probe(config)))
        after_first = after_first or time.perf_counter()  # (the first also pays torch's one-time set-up)
        if chosen is not None and short_of(probed[-1], seconds, step_chars, most_chars, line):
            break
        chosen = probed[-1]
    chars = min(most_chars, chosen.chars_per_s * seconds)
    reason = describe_choice(chosen, probed, seconds, train_chars, step_chars, most_chars, stopped, line)
    return SizeChoice(chosen.config, tuple(probed), time.perf_counter() - start, chars, reason)


def short_of(size: Probed, seconds: float, step_chars: int, most_chars: float = math.inf,
             line: float = CHARS_PER_PARAM) -> str:
    """What ``size`` lacks to be chosen (``line`` characters per parameter, the steps of
    ``steps_line``), said; empty if nothing."""
    chars = min(most_chars, size.chars_per_s * seconds)
    if chars / params(size.config) < line:
        return f"{chars / params(size.config):.1f} per parameter, below the line of {line:.2g}"
    steps, least = chars / max(1, step_chars), steps_line(line)
    if steps < least:
        return f"{steps:,.0f} steps, below the line of {least:,.0f}"
    return ""


def describe_choice(chosen: Probed, probed: list[Probed], seconds: float, train_chars: int, step_chars: int,
                    most_chars: float = math.inf, stopped: str = "", line: float = CHARS_PER_PARAM) -> str:
    speeds = ", ".join(f"{p.name} {p.chars_per_s:,.0f}" for p in probed)
    chars = min(most_chars, chosen.chars_per_s * seconds)
    why = (f"{chosen.name} can train on {chars / 1e6:.3g}M characters, {chars / params(chosen.config):.1f} per "
           f"parameter, in {chars / max(1, step_chars):,.0f} steps ({chars / train_chars:.3g} epochs)")
    if probed[-1] is not chosen:
        bigger = probed[probed.index(chosen) + 1]
        why += f"; {bigger.name} on {short_of(bigger, seconds, step_chars, most_chars, line)}"
    elif stopped:
        why += f"; the next size is {stopped}"
    return f"probe (chars/s) {speeds}; {why}"
