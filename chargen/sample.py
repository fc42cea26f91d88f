"""Sampling: the LSTM state is carried, so each new character costs one step and the
growing text is never fed again."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .checks import check_seed
from .device import wide_dtype
from .errors import ChargenError
from .model import CharLSTM, LeanState, LeanStep, State
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, CharTokenizer


@dataclass(frozen=True)
class SamplingOptions:
    """How each next character is drawn, and how many. Its defaults are the defaults of the
    API, the CLI, the app and the samples shown during training: written here once."""

    temperature: float = 0.8  # 0 is greedy; higher is wilder
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    length: int = 500


DEFAULTS = SamplingOptions()

# Beyond these a request is a mistake, or a wait of hours: 10 M characters is about 20
# minutes of one sample on a small CPU, and a batch's texts are held in memory.
MAX_LENGTH = 10_000_000
MAX_SAMPLES = 10_000
MAX_BATCH_CHARS = 100_000_000


def check_sampling(temperature: float, top_k: int, top_p: float, length: int, num_samples: int) -> None:
    if not 0 <= temperature < math.inf:
        raise ChargenError(f"--temperature must be 0 or more (0 means greedy) and finite, not {temperature}")
    if top_k < 0:
        raise ChargenError(f"--top-k must be 0 (off) or more, not {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ChargenError(f"--top-p must be in (0, 1], not {top_p}")
    if not 0 <= length <= MAX_LENGTH:
        raise ChargenError(f"--length must be 0 to {MAX_LENGTH:,}, not {length}")
    if not 1 <= num_samples <= MAX_SAMPLES:
        raise ChargenError(f"--num-samples must be 1 to {MAX_SAMPLES:,}, not {num_samples}")
    if num_samples > 1 and length * num_samples > MAX_BATCH_CHARS:
        raise ChargenError(f"{num_samples:,} samples of {length:,} characters would hold "
                           f"{length * num_samples:,} characters; ask for at most {MAX_BATCH_CHARS:,} at once")


@dataclass(frozen=True)
class Prepared:
    """``pick_prepared``'s per-row options with what they imply worked out once, by ``prepare``: a
    text's options do not change from step to step, so a loop prepares them when its rows
    change, not at every step."""

    scale: torch.Tensor  # (rows, 1) float32: each row's temperature (1 where greedy)
    greedy: torch.Tensor | None  # (rows,) the rows at temperature 0; None if none is
    kth: torch.Tensor | None  # (rows, 1) where each row's k-th likeliest sits; None if no row cuts by k
    top_p: torch.Tensor | None  # (rows, 1) float32; None if no row cuts by p
    cut: torch.Tensor  # (rows, 1) the rows that cut by p


def prepare(temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, vocab: int) -> Prepared:
    """The (rows,) options of ``pick_prepared`` for logits of ``vocab`` ids, prepared."""
    tiny, largest = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    greedy = temperature < tiny  # 0, or too small for float32 to tell from 0
    # The temperature kept within float32: no temperature, however small or large, makes an
    # inf or a 0 x inf (and so a NaN softmax) of the shifted logits.
    scale = torch.where(greedy, 1.0, temperature.clamp(max=largest)).float().unsqueeze(-1)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    cut = top_p < 1.0
    return Prepared(scale, greedy if bool(greedy.any()) else None,
                    (k - 1).unsqueeze(-1) if bool((k < vocab).any()) else None,
                    top_p.float().unsqueeze(-1) if bool(cut.any()) else None, cut.unsqueeze(-1))


def pick_prepared(logits: torch.Tensor, options: Prepared, race: torch.Tensor) -> torch.Tensor:
    """Next ids (rows,) from logits (rows, vocab), each row with its own options (``prepare``'s,
    from tensors of (rows,)): greedy at temperature 0, otherwise a draw from the temperature-scaled
    distribution cut to the row's top k and top p. ``race`` (rows, vocab) holds Exp(1)
    draws from each row's own random stream: the id drawn is the one whose probability over
    its draw is largest (the exponential race: id i wins with probability p_i).

    Each row's id depends on its own logits, options and draws alone, computed by the same
    operations whatever the other rows ask for (a row that cuts nothing goes through a cut
    unchanged), so a text drawn among others is the text drawn alone."""
    logits = logits.float()
    scaled = (logits - logits.max(dim=-1, keepdim=True).values) / options.scale  # (the likeliest at 0)
    if options.kth is not None:
        kth = scaled.sort(dim=-1, descending=True).values.gather(-1, options.kth)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if options.top_p is not None:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the ones before it already cover top_p; the top one stays.
        drop = (probs.cumsum(dim=-1) - probs >= options.top_p) & options.cut
        drop[:, 0] = False  # (a top_p below float32's smallest number compares as 0)
        kept = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, kept)
    # (a draw of exactly 0 would make 0/0 for a banned id: it is kept above 0)
    drawn = (scaled.softmax(dim=-1).to(race.dtype) / race.clamp(min=torch.finfo(race.dtype).tiny)).argmax(dim=-1)
    return drawn if options.greedy is None else torch.where(options.greedy, logits.argmax(dim=-1), drawn)


def draw_race(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Exp(1) draws (rows, vocab) in float64 (float32 on MPS) from ``generator``: a row's next
    random numbers."""
    return torch.empty(rows, vocab, dtype=wide_dtype(generator.device),
                       device=generator.device).exponential_(generator=generator)


def row_options(options: SamplingOptions, rows: int, device: torch.device | str = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``options`` as the (rows,) tensors ``pick_prepared`` takes."""
    return (torch.full((rows,), options.temperature, dtype=wide_dtype(device), device=device),
            torch.full((rows,), options.top_k, dtype=torch.long, device=device),
            torch.full((rows,), options.top_p, dtype=wide_dtype(device), device=device))


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    check_seed(seed)
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


LEAN_MAX_SAMPLES = 8  # up to this many samples at once, the lean step is the faster path


def prime_ids(tokenizer: CharTokenizer, prime: str, items: bool) -> list[int]:
    """The ids a sampler feeds before its first draw: the prime's (a character the model
    never saw is refused, named), after ``<bos>`` in lines mode."""
    ids = tokenizer.encode_known(prime, "prefix" if items else "prime text").tolist()
    ids = [BOS_ID, *ids] if items else ids
    if not ids:
        raise ChargenError("sampling needs at least one prime character")
    return ids


def banned_ids(items: bool) -> tuple[int, ...]:
    """The ids a sampler never draws: the specials, but for ``<eos>``, which ends an item."""
    return (PAD_ID, UNK_ID, BOS_ID) if items else tuple(range(len(SPECIALS)))


class Drawn:
    """What a sampler hands out, whatever computes it: each sample's text so far, which
    items have ended, and ``pieces``, the steps to come (a subclass's ``_steps``)."""

    def __init__(self, tokenizer: CharTokenizer, num_samples: int, items: bool) -> None:
        if num_samples < 1:
            raise ChargenError(f"--num-samples must be at least 1, not {num_samples}")
        self.num_samples, self.items = num_samples, items
        self._chars = [""] * len(SPECIALS) + tokenizer.chars
        self._drawn: list[list[str]] = [[] for _ in range(num_samples)]
        self.ended = [False] * num_samples

    @property
    def texts(self) -> list[str]:
        """What each sample has drawn so far, the prime not included."""
        return ["".join(drawn) for drawn in self._drawn]

    def append(self, ids: list[int]) -> list[str]:
        """Each sample's new character for the ids drawn at a step ("" for an item that has
        ended, whatever its id)."""
        out = []
        for j, i in enumerate(ids):
            self.ended[j] = self.ended[j] or (self.items and i == EOS_ID)
            piece = "" if self.ended[j] else self._chars[i]
            self._drawn[j].append(piece)
            out.append(piece)
        return out

    def pieces(self, length: int, temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k,
               top_p: float = DEFAULTS.top_p
               ) -> Iterator[list[str]]:
        """Yields up to ``length`` steps, each the new character of every sample ("" for an
        item that has ended); the steps stop early once every item has ended. The options
        are checked now, not when the first character is asked for."""
        check_sampling(temperature, top_k, top_p, length, self.num_samples)
        return self._steps(length, SamplingOptions(temperature, top_k, top_p))

    def _steps(self, length: int, options: SamplingOptions) -> Iterator[list[str]]:
        raise NotImplementedError


class Sampler(Drawn):
    """``num_samples`` samples drawn in parallel as one batch. The LSTM state is carried
    from call to call, so ``pieces`` can be called again to continue every sample from
    where it stopped: the state is kept, the text is never fed again.

    With ``items`` (lines mode) every sample is an item started from ``<bos>`` and
    ``prime``; it ends at its ``<eos>`` and yields "" from then on.

    A step is in three parts, so that the app's shared loop (chargen.batching) can step many
    samplers' rows as one batch: ``pending``/``state`` (the rows' inputs), ``race`` (this
    sampler's random draws) and ``take`` (the ids drawn, as text)."""

    def __init__(
        self,
        model: CharLSTM,
        tokenizer: CharTokenizer,
        prime: str,
        *,
        num_samples: int = 1,
        seed: int | None = None,
        items: bool = False,
        lean: bool | None = None,
        step: LeanStep | None = None,
    ) -> None:
        super().__init__(tokenizer, num_samples, items)
        first = prime_ids(tokenizer, prime, items)
        self.model = model.eval()
        # After the prime, each character is one step. For a few samples a LeanStep draws the
        # same characters at up to 3x the speed of nn.LSTM (per-call overhead dominates);
        # from about 16 samples nn.LSTM's fused kernel is faster (python -m benchmarks.sampling).
        # ``lean``: None chooses by that, True or False forces; ``step``: one built before
        # (it holds a copy of the weights).
        if lean is None:
            lean = num_samples <= LEAN_MAX_SAMPLES
        self._step = (step or model.stepper()) if lean else None
        self.vocab_size = len(self._chars)
        self.device = model.head.weight.device
        self.race_dtype = wide_dtype(self.device)
        self._generator = make_generator(seed, self.device)
        self.banned = torch.tensor(banned_ids(items), dtype=torch.long, device=self.device)
        self._prime = torch.tensor(first, dtype=torch.long, device=self.device)
        # The ids drawn last and not yet fed (num_samples,), and the state they are fed into:
        # fed when the next character is asked for, so a sample that stops costs no step it
        # does not use. Both are set by ``start``.
        self.pending: torch.Tensor | None = None
        self.state: State | LeanState | None = None

    @torch.inference_mode()
    def start(self) -> None:
        """Feed the prime, all but its last character, once (nn.LSTM over the whole of it,
        for one sample: they all start alike); its last character is the first pending id.
        Done by the first step if not before."""
        if self.pending is not None:
            return
        n = self.num_samples
        if len(self._prime) > 1:
            _, state = self.model(self._prime[:-1].unsqueeze(1))
            self.state = (state[0].expand(-1, n, -1).contiguous(), state[1].expand(-1, n, -1).contiguous())
        else:
            self.state = self.model.initial_state(n)
        if self._step is not None:
            self.state = self._step.begin(self.state)
        self.pending = self._prime[-1:].expand(n).contiguous()

    def race(self) -> torch.Tensor:
        """This step's random draws for every sample (see ``pick_prepared``)."""
        out = torch.empty(self.num_samples, self.vocab_size, dtype=self.race_dtype, device=self.device)
        self.race_into(out)
        return out

    def race_into(self, out: torch.Tensor) -> None:
        """``race`` written into ``out`` (num_samples, vocab; contiguous, ``wide_dtype``), where a
        batch keeps one buffer for all its rows: the one place a sampler draws."""
        out.exponential_(generator=self._generator)

    def take(self, ids: torch.Tensor) -> list[str]:
        """The ids drawn at this step (num_samples,): the next pending ids, and the new
        character of every sample ("" for an item that has ended)."""
        self.pending = ids
        return self.append(ids.tolist())

    @torch.inference_mode()
    def _steps(self, length: int, options: SamplingOptions) -> Iterator[list[str]]:
        prepared = prepare(*row_options(options, self.num_samples, self.device), self.vocab_size)
        for _ in range(length):
            if all(self.ended):
                return
            self.start()
            if self._step is not None:
                logits, self.state = self._step(self.pending, self.state)
            else:
                logits, self.state = self.model(self.pending.unsqueeze(0), self.state[:2])  # (h, c) of a LeanState
                logits = logits[0]
            logits = logits.index_fill(-1, self.banned, float("-inf"))
            yield self.take(pick_prepared(logits, prepared, self.race()))


def sample_text(
    model: CharLSTM,
    tokenizer: CharTokenizer,
    prime: str,
    length: int,
    *,
    num_samples: int = 1,
    temperature: float = DEFAULTS.temperature,
    top_k: int = DEFAULTS.top_k,
    top_p: float = DEFAULTS.top_p,
    seed: int | None = None,
    items: bool = False,
) -> Iterator[list[str]]:
    """One list per step: the new character of every sample (see ``Sampler``). The options
    and the prime are checked now, so a bad prime fails before anything is shown."""
    sampler = Sampler(model, tokenizer, prime, num_samples=num_samples, seed=seed, items=items)
    return sampler.pieces(length, temperature, top_k, top_p)


def collect(pieces: Iterator[list[str]], num_samples: int) -> list[str]:
    """The texts that a stream of per-step pieces spells out, one per sample."""
    texts: list[list[str]] = [[] for _ in range(num_samples)]
    for step in pieces:
        for text, piece in zip(texts, step, strict=True):
            text.append(piece)
    return ["".join(t) for t in texts]
