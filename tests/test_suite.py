"""The budget suite's own pieces (python -m benchmarks.suite): the settings run around
auto's choice, and the transformer baseline scoring every validation character once."""

import hashlib
import io
import json
import tarfile

import numpy as np
import pytest
import torch

import chargen.model
from benchmarks import (
    dropout_schedule,
    locked_dropout,
    schedule_knobs,
    split_dropout,
    suite_texts,
    tied_weights,
    tiny_gpt,
    weight_average,
)
from benchmarks.common import cpu_name
from benchmarks.suite import around, cell_rows, command, report
from benchmarks.suite import main as suite_main
from benchmarks.suite_texts import gutenberg_body, tidy, whole_files
from benchmarks.weight_drop import dropped_forward
from benchmarks.weight_drop import main as weight_drop_main
from chargen import load_corpus
from chargen.model import CharLSTM, ModelConfig
from chargen.schedule import BatchScaling


def use_a_short_text(monkeypatch, tmp_path, benchmark) -> None:
    """``benchmark`` trains on a short text of its own in place of a suite text."""
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be, that is the question\n" * 200)
    monkeypatch.setattr(benchmark, "suite_corpus", lambda kind: load_corpus(text))


def test_the_settings_around_autos_choice_are_its_ladder_neighbours_and_dropout_neighbours():
    assert around({"size": "1x512", "dropout": 0.1}) == ["1x256:0.1", "2x512:0.1", "1x512:0", "1x512:0.2"]
    assert around({"size": "1x128", "dropout": 0.0}) == ["1x256:0", "1x128:0.1"]  # (the ladder's and dropout's ends)
    assert around({"size": "3x1024", "dropout": 0.4}) == ["2x1024:0.4", "3x1024:0.3"]


@pytest.mark.parametrize("n", [2, 30, 65, 66, 97, 98, 1000, 1001])
def test_the_transformer_scores_every_target_once(n):
    scored = []
    for start, offset in tiny_gpt.windows(n):
        assert start + min(n, tiny_gpt.CONTEXT + 1) <= n
        scored += [start + 1 + k for k in range(offset, min(n - 1, tiny_gpt.CONTEXT))]
    assert sorted(scored) == list(range(1, n))


def test_the_transformers_score_is_the_mean_loss_of_its_windows():
    torch.manual_seed(0)
    model, ids = tiny_gpt.TinyGPT(7), np.random.default_rng(0).integers(0, 7, 300)
    with torch.inference_mode():  # each target alone, in its window, against the batched score
        losses = [torch.nn.functional.cross_entropy(model(torch.from_numpy(ids[s : s + 65])[None, :-1])[0, k],
                                                    torch.tensor(ids[s + 1 + k])).item()
                  for s, offset in tiny_gpt.windows(len(ids)) for k in range(offset, 64)]
    assert len(losses) == len(ids) - 1 and tiny_gpt.score(model, ids) == pytest.approx(np.mean(losses), rel=1e-5)


def test_the_transformer_keeps_the_weights_of_its_best_validation_estimate(monkeypatch):
    """As nanoGPT's config (always_save_checkpoint = False): estimates every EVAL_INTERVAL
    steps; the second is the best, so its weights come back, not the last."""
    estimates, snapshots = iter([3.0, 1.0]), []

    def estimate(model, data, rng):
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return next(estimates, 2.0)

    monkeypatch.setattr(tiny_gpt, "EVAL_INTERVAL", 2)
    monkeypatch.setattr(tiny_gpt, "estimate_loss", estimate)
    ids = np.random.default_rng(0).integers(0, 7, 500)
    model, steps, _, kept = tiny_gpt.train(ids, 7, 1.0, val_ids=ids[:200])
    assert steps > 6 and kept == 4 and len(snapshots) >= 3
    assert all(torch.equal(v, snapshots[1][k]) for k, v in model.state_dict().items())
    _, steps, _, kept = tiny_gpt.train(ids, 7, 0.2)
    assert kept == steps  # (without a validation text: the last)


def test_a_gutenberg_text_loses_its_header_and_licence():
    text = "Title\r\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\nBody  \r\n\r\n\r\n\r\nEnd.\r\n" \
           "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nLicence"
    assert tidy(gutenberg_body(text)) == "Body\n\nEnd.\n"


def test_a_source_text_is_whole_files_in_path_order_until_it_is_long_enough(monkeypatch):
    monkeypatch.setattr(suite_texts, "SIZE", 20)
    files = {"b/z.py": b"x = 2  \r\n", "a/y.py": b"x = 1\n\n\n\nprint(x)\n", "c.py": b"never = 3\n"}
    assert whole_files(files) == "x = 1\n\nprint(x)\n\nx = 2\n\n"


def fake_deb(files: dict[str, bytes]) -> bytes:
    """A Debian package as ``ar`` lays it out (a signature, then members behind 60-byte
    headers), its data.tar.xz holding ``files``."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))

    def member(name: str, content: bytes) -> bytes:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n".encode()
        return header + content + b"\n" * (len(content) % 2)

    return b"!<arch>\n" + member("debian-binary", b"2.0\n") + member("data.tar.xz", data.getvalue())


def test_the_word_list_comes_from_its_pinned_debian_package_shuffled_without_possessives(tmp_path, monkeypatch):
    words = [f"w{i:02d}" for i in range(30)] + ["cat's", "dog's"]
    deb = fake_deb({"./usr/share/dict/american-english": "\n".join(words).encode(), "./usr/share/doc/x": b"no"})
    name = "wamerican_2020.12.07-2_all.deb"
    (tmp_path / name).write_bytes(deb)
    monkeypatch.setitem(suite_texts.ARCHIVES, name, hashlib.sha256(deb).hexdigest())
    monkeypatch.setattr(suite_texts, "WORDS", 20)
    items = suite_texts.words(tmp_path).splitlines()
    assert len(items) == len(set(items)) == 20 and set(items) < set(words[:30]) and items != sorted(items)
    assert suite_texts.deb_members(deb, lambda path: path.endswith("/x")) == {"./usr/share/doc/x": b"no"}
    (tmp_path / name).write_bytes(deb + b"!")
    with pytest.raises(SystemExit, match="not the pinned archive"):
        suite_texts.words(tmp_path)


def test_a_tagged_set_of_runs_is_counted_apart_from_the_first():
    """A repeat or a rerun after a change (``--tag``) runs again what the untagged set has
    done, and counts as done only what its own tag has."""
    row = {"text": "play", "isa": "native", "budget": 60.0, "cpu": cpu_name(), "config": "auto"}
    rows = [row, row | {"tag": "ramp", "config": "1x512:0.2"}]
    assert [r["config"] for r in cell_rows(rows, "play", "native", 60.0)] == ["auto"]
    assert [r["config"] for r in cell_rows(rows, "play", "native", 60.0, "ramp")] == ["1x512:0.2"]
    assert cell_rows(rows, "play", "native", 137.0, "ramp") == []


@pytest.mark.parametrize("tag", ["../out", "a/b", ".hidden", "", "x" * 41, "a b"])
def test_a_tag_that_cannot_name_a_run_folder_is_refused_in_one_line(tag, capsys):
    """The tag names run folders: a path, a dot-file or an empty name is refused before any run."""
    with pytest.raises(SystemExit) as stop:
        suite_main(["--tag", tag, "--texts", "play", "--budgets", "1", "--isa", "native", "--configs", "auto"])
    assert stop.value.code == 2 and "cannot name a run folder" in capsys.readouterr().err


def test_fixed_steps_replace_the_budgets_time_and_make_a_table_of_their_own(tmp_path):
    """--steps: a fixed setting trains for so many steps (the host's drift cannot give one
    setting more of them), and its rows are compared only with each other."""
    cmd = command("1x512:0.2", tmp_path / "t", tmp_path / "v", 411.0, tmp_path, steps=3200)
    assert "--max-time" not in cmd and cmd[cmd.index("--steps") + 1] == "3200"
    assert cmd[cmd.index("--dropout") + 1] == "0.2"
    assert "--max-time" in command("1x512:0.2", tmp_path / "t", tmp_path / "v", 411.0, tmp_path)
    row = {"text": "russian", "isa": "native", "budget": 411.0, "cpu": "x", "size": "1x512", "weight_decay": 0.01,
           "steps": 3200, "epochs": 15.0, "cli_seconds": 500.0}
    rows = [row | {"config": "1x512:0.1", "dropout": 0.1, "val_loss": 1.36, "base_lr": 0.006},
            row | {"config": "1x512:0.2", "dropout": 0.2, "val_loss": 1.38, "tag": "steps-3200", "fixed_steps": 3200},
            row | {"config": "1x512:0.3", "dropout": 0.3, "val_loss": 1.39, "tag": "steps-3200", "fixed_steps": 3200}]
    timed, stepped = report(rows).split("### ")[1:]
    assert "(each 3,200 steps)" in stepped and "1x512:0.1" not in stepped and "| +0.010 |" in stepped
    assert "121.7%" in timed and "%" not in stepped  # (a run of fixed steps has no budget to end within)
    assert "dropout 0.1, wd 0.01, lr 0.006 |" in timed and "lr" not in stepped  # (rows from before 12-07: none)


@pytest.mark.parametrize("args", [["--configs", "auto"], ["--configs", "1x512:0.1", "gpt"], ["--steps", "0"]])
def test_fixed_steps_are_for_fixed_settings_only(args, capsys):
    with pytest.raises(SystemExit) as stop:
        suite_main(["--steps", "100", "--texts", "play", "--budgets", "1", "--isa", "native", "--configs",
                    "1x128:0", *args])
    assert stop.value.code == 2 and "--steps runs fixed settings" in capsys.readouterr().err


def test_weight_drop_trains_on_dropped_recurrent_weights_and_scores_on_the_whole():
    torch.manual_seed(0)
    model, ids = CharLSTM(ModelConfig(vocab_size=11, embedding=4, hidden=8, dropout=0.0)), torch.randint(11, (5, 3))
    model.eval()
    assert torch.equal(dropped_forward(0.5)(model, ids)[0], model(ids)[0])  # scoring: the whole weights
    model.train()
    assert torch.equal(dropped_forward(0.0)(model, ids)[0], model(ids)[0])
    dropped, _ = dropped_forward(0.5)(model, ids)
    assert not torch.allclose(dropped, model(ids)[0])
    dropped.sum().backward()
    assert model.lstm.weight_hh_l0.grad is not None and model.lstm.weight_hh_l0.grad.abs().sum() > 0


def test_locked_dropout_trains_each_kind_with_its_own_dropout_and_puts_chargens_back(tmp_path, monkeypatch):
    use_a_short_text(monkeypatch, tmp_path, locked_dropout)
    built = []
    real_row = locked_dropout.equal_steps_row

    def row(corpus, out, name, model, steps, **options):
        result = real_row(corpus, out, name, model, steps, **options)
        built.append((name, chargen.model.LockedDropout, CharLSTM.forward))
        return result

    monkeypatch.setattr(locked_dropout, "equal_steps_row", row)
    chargens = CharLSTM.forward
    locked_dropout.main(["--steps", "2", "--hidden", "8", "--out", str(tmp_path / "out")])
    locked_dropout.main(["--steps", "2", "--hidden", "8", "--layers", "2", "--kinds", "between", "--out",
                         str(tmp_path / "out")])
    assert built == [("play-1x8-locked:0.2", chargen.model.LockedDropout, chargens),
                     ("play-1x8-element:0.2", torch.nn.Dropout, chargens),
                     ("play-2x8-between:0.2", chargen.model.LockedDropout, locked_dropout.locked_between_forward)]
    assert chargen.model.LockedDropout is not torch.nn.Dropout and CharLSTM.forward is chargens  # chargen's again
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(row["kind"], row["layers"]) for row in rows] == [("locked", 1), ("element", 1), ("between", 2)]


def test_the_between_kind_locks_the_mask_between_stacked_layers_and_is_otherwise_chargens():
    """Two layers in training with dropout: the second layer's input drops the same features at
    every step of a row (nn.LSTM's own dropout would not); with masks of ones the layer by layer
    run is chargen's forward, logits and state alike; in eval it is the fused call."""
    torch.manual_seed(0)
    model = CharLSTM(ModelConfig(vocab_size=5, embedding=16, hidden=8, layers=2, dropout=0.5)).train()
    masked = []
    model.drop.register_forward_hook(lambda module, args, out: masked.append(out))
    ids, state = torch.full((6, 3), 2), (torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    locked_dropout.locked_between_forward(model, ids, state)
    assert len(masked) == 3  # (embedding, between the layers, output)
    dropped = masked[1] == 0
    assert dropped.any() and torch.equal(dropped, dropped[:1].expand_as(dropped))
    model.drop.p, model.lstm.dropout = 1e-9, 0.0  # (the layer by layer path, masks of ones)
    logits, (h, c) = locked_dropout.locked_between_forward(model, ids, state)
    torch.testing.assert_close((logits, h, c), (model(ids, state)[0], *model(ids, state)[1]))
    logits.sum().backward()
    assert model.lstm.weight_hh_l1.grad.abs().sum() > 0 and model.lstm.weight_ih_l0.grad.abs().sum() > 0
    calls = []
    model.lstm.register_forward_hook(lambda module, args, out: calls.append(1))
    locked_dropout.locked_between_forward(model.eval(), ids, state)
    assert calls


def test_schedule_knobs_trains_each_setting_with_its_floor_decay_and_weight_decay_then_puts_chargens_back(
        tmp_path, monkeypatch):
    use_a_short_text(monkeypatch, tmp_path, schedule_knobs)
    chargens = BatchScaling.schedule
    schedule_knobs.main(["--steps", "4", "--hidden", "8", "--settings", "linear:0:0.1", "cosine:0.1:0.01",
                         "--out", str(tmp_path / "out")])
    assert BatchScaling.schedule is chargens
    runs = sorted((tmp_path / "out" / "runs").iterdir())
    saved = {run.name: json.loads((run / "config.json").read_text()) for run in runs}
    linear = saved["play-1x8_0.2-linear_0_0.1-4"]
    assert linear["lr_schedule"]["decay"] == "linear" and linear["lr_schedule"]["final_lr"] == 0
    assert linear["train"]["weight_decay"] == 0.1
    chargens_own = saved["play-1x8_0.2-cosine_0.1_0.01-4"]["lr_schedule"]
    assert chargens_own["final_lr"] == pytest.approx(0.1 * chargens_own["peak_lr"])
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(row["decay"], row["floor"], row["weight_decay"]) for row in rows] == [("linear", 0, 0.1),
                                                                                   ("cosine", 0.1, 0.01)]


@pytest.mark.parametrize("main, args, said", [
    (schedule_knobs.main, ["--settings", "cosine:0.1"], "is not DECAY:FLOOR:WEIGHT_DECAY"),
    (schedule_knobs.main, ["--settings", "cosine:x:0.01"], "is not DECAY:FLOOR:WEIGHT_DECAY"),
    (schedule_knobs.main, ["--settings", "step:0.1:0.01"], "--decay must be one of"),
    (schedule_knobs.main, ["--settings", "cosine:2:0.01"], "the final lr fraction must be in [0, 1]"),
    # refused before the first setting trains, not by train() after it
    (schedule_knobs.main, ["--settings", "cosine:0.1:0.01", "exp:0:0.01"], "never reaches 0"),
    (schedule_knobs.main, ["--settings", "cosine:0.1:0.01", "cosine:0.1:5"], "--weight-decay must be 0 to 1"),
    (schedule_knobs.main, ["--steps", "0"], "--steps must be at least 1"),
    (schedule_knobs.main, ["--layers", "65"], "--layers must be 1 to 64"),
    (weight_drop_main, ["--settings", "0.5"], "is not WEIGHT_DROP:DROPOUT"),
    (weight_drop_main, ["--settings", "x:0.2"], "is not WEIGHT_DROP:DROPOUT"),
    (weight_drop_main, ["--settings", "1:0.2"], "is not WEIGHT_DROP:DROPOUT"),
    (weight_drop_main, ["--steps", "0"], "--steps must be at least 1"),
    (locked_dropout.main, ["--steps", "0"], "--steps must be at least 1"),
    (locked_dropout.main, ["--hidden", "0"], "--hidden must be 1 to 65,536, not 0"),
    (locked_dropout.main, ["--layers", "0"], "--layers must be 1 to 64, not 0"),
    (locked_dropout.main, ["--layers", "65"], "--layers must be 1 to 64"),
    (locked_dropout.main, ["--dropout", "1"], "--dropout must be in [0, 1)"),
    (locked_dropout.main, ["--dropout", "0"], "--dropout must be in (0, 1), not 0"),
    (locked_dropout.main, ["--kinds", "weight"], "invalid choice: 'weight'"),
    (schedule_knobs.main, ["--embedding", "0"], "--embedding must be 1 to 65,536, not 0"),
    (schedule_knobs.main, ["--base-lr", "2"], "--base-lr must be between 0 and 1"),
    (weight_average.main, ["--settings", "1"], "is not DECAY[:START]"),
    (weight_average.main, ["--settings", "0.9:-1"], "is not DECAY[:START]"),
    (weight_average.main, ["--settings", "0.9:1:2"], "is not DECAY[:START]"),
    (weight_average.main, ["--steps", "0"], "--steps must be at least 1"),
    (tied_weights.main, ["--hidden", "16", "--embedding", "8"], "tying needs --embedding equal to --hidden (16)"),
    (tied_weights.main, ["--settings", "loose"], "invalid choice: 'loose'"),
    (dropout_schedule.main, ["--settings", "ramp"], "is not const:P, ramp:P or late:START:P"),
    (dropout_schedule.main, ["--settings", "const:1"], "is not const:P, ramp:P or late:START:P"),
    (dropout_schedule.main, ["--settings", "late:2:0.3"], "is not const:P, ramp:P or late:START:P"),
    (dropout_schedule.main, ["--settings", "wobble:0.2"], "is not const:P, ramp:P or late:START:P"),
    (split_dropout.main, ["--settings", "0.2"], "is not IN:OUT"),
    (split_dropout.main, ["--seed", "-1"], "--seed must be 0 to"),
    (split_dropout.main, ["--settings", "0.1:1"], "is not IN:OUT"),
    (split_dropout.main, ["--settings", "a:0.1"], "is not IN:OUT"),
    (schedule_knobs.main, ["--steps", "2", "--hidden", "8", "--out", "/dev/null"], "choose a folder you can")])
def test_the_dropout_benchmarks_refuse_a_bad_argument_in_one_line(main, args, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2 and said in capsys.readouterr().err.strip().splitlines()[-1]


def test_schedule_knobs_trains_the_embedding_and_peak_lr_it_is_given(tmp_path, monkeypatch):
    use_a_short_text(monkeypatch, tmp_path, schedule_knobs)
    schedule_knobs.main(["--steps", "2", "--hidden", "8", "--embedding", "16", "--base-lr", "0.001",
                         "--out", str(tmp_path / "out")])
    saved = json.loads((tmp_path / "out" / "runs" / "play-1x8_0.2-e16-lr0.001-cosine_0.1_0.01-2" /
                        "config.json").read_text())
    assert saved["model"]["embedding"] == 16 and saved["train"]["base_lr"] == 0.001
    row = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[-1])
    assert (row["embedding"], row["base_lr"]) == (16, 0.001)


def test_weight_average_scores_the_average_and_leaves_the_live_training_alone(tmp_path, monkeypatch):
    from chargen.storage import load_tensors
    from chargen.train import Trainer

    use_a_short_text(monkeypatch, tmp_path, weight_average)
    chargens = Trainer.update, Trainer.score
    weight_average.main(["--steps", "6", "--hidden", "8", "--settings", "0", "0.5:2", "--out", str(tmp_path / "out")])
    assert (Trainer.update, Trainer.score) == chargens
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(row["decay"], row["start"]) for row in rows] == [(0.0, 0), (0.5, 2)]
    assert rows[0]["best_val_loss"] != rows[1]["best_val_loss"]  # the average was scored ...
    runs = tmp_path / "out" / "runs"
    live = [load_tensors(runs / name / "model.safetensors")[0]
            for name in ("play-1x8_0.2-e64-avg0_0-6", "play-1x8_0.2-e64-avg0.5_2-6")]
    assert live[0].keys() == live[1].keys()
    assert all(torch.equal(live[0][k], live[1][k]) for k in live[0])  # ... and the live weights trained as alone


def test_tied_weights_scores_with_the_embeddings_matrix_and_trains_it_from_both_ends(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, ids = CharLSTM(ModelConfig(vocab_size=11, embedding=8, hidden=8, dropout=0.0)), torch.randint(11, (5, 3))
    logits, _ = tied_weights.tied_forward(model, ids)
    out, _ = model.lstm(model.embed(ids), model.initial_state(3))
    assert torch.allclose(logits, out @ model.embed.weight.T + model.head.bias)
    logits.sum().backward()
    assert model.head.weight.grad is None and model.embed.weight.grad.abs().sum() > 0
    use_a_short_text(monkeypatch, tmp_path, tied_weights)
    chargens = CharLSTM.forward
    tied_weights.main(["--steps", "3", "--hidden", "8", "--out", str(tmp_path / "out")])
    assert CharLSTM.forward is chargens
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(row["embedding"], row["tied"]) for row in rows] == [(8, False), (8, True)]
    assert rows[0]["best_val_loss"] != rows[1]["best_val_loss"]


def test_dropout_schedule_sets_the_models_dropout_by_the_share_of_the_run_done(tmp_path, monkeypatch):
    from chargen.train import Trainer

    set_to: list[float] = []
    set_dropout = CharLSTM.set_dropout
    monkeypatch.setattr(CharLSTM, "set_dropout", lambda model, p: (set_to.append(p), set_dropout(model, p)))
    use_a_short_text(monkeypatch, tmp_path, dropout_schedule)
    chargens = Trainer.fit, Trainer.update
    dropout_schedule.main(["--steps", "4", "--hidden", "8", "--out", str(tmp_path / "out"),
                           "--settings", "ramp:0.4", "late:0.5:0.3", "const:0.2"])
    assert (Trainer.fit, Trainer.update) == chargens
    assert set_to == [0.0, 0.1, 0.2, 0.3, 0.4] + [0.0, 0.0, 0.3, 0.3, 0.3] + [0.2] * 5
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [row["schedule"] for row in rows] == ["ramp:0.4", "late:0.5:0.3", "const:0.2"]
    assert len({row["best_val_loss"] for row in rows}) == 3


def test_split_dropout_drops_the_input_and_the_output_at_their_own_rates(tmp_path, monkeypatch):
    """In training the embedding loses features at IN's rate and the LSTM's output at OUT's,
    each with one mask a row; scoring drops nothing; chargen's forward comes back after."""
    torch.manual_seed(0)
    model, ids = CharLSTM(ModelConfig(vocab_size=11, embedding=64, hidden=64, dropout=0.0)), torch.randint(11, (7, 5))
    seen = {}
    model.lstm.register_forward_hook(lambda module, args, out: seen.update(lstm_in=args[0], lstm_out=out[0]))
    model.head.register_forward_hook(lambda module, args, out: seen.update(head_in=args[0]))
    chargens = CharLSTM.forward
    with split_dropout.split(0.0, 0.5):
        model(ids)
        assert torch.equal(seen["lstm_in"], model.embed(ids))  # none on the input
        dropped = seen["head_in"] == 0
        assert torch.equal(dropped, dropped[:1].expand_as(dropped)) and 0.3 < dropped.float().mean() < 0.7
        assert torch.allclose(seen["head_in"][~dropped], 2 * seen["lstm_out"][~dropped])
        model.eval()
        assert torch.equal(model(ids)[0], chargens(model, ids)[0])  # scoring: nothing dropped
    assert CharLSTM.forward is chargens
    use_a_short_text(monkeypatch, tmp_path, split_dropout)
    split_dropout.main(["--steps", "3", "--hidden", "8", "--out", str(tmp_path / "out"), "--settings", "0.2:0.2",
                        "0:0.4"])
    assert CharLSTM.forward is chargens
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(row["input_dropout"], row["output_dropout"]) for row in rows] == [(0.2, 0.2), (0.0, 0.4)]
    assert rows[0]["best_val_loss"] != rows[1]["best_val_loss"]


def test_another_seed_is_another_run_of_the_same_setting(tmp_path, monkeypatch):
    """--seed gives the noise between runs: its own folder and row, another result."""
    use_a_short_text(monkeypatch, tmp_path, dropout_schedule)
    for seed in ("1234", "7"):
        dropout_schedule.main(["--steps", "3", "--hidden", "8", "--seed", seed, "--out", str(tmp_path / "out"),
                               "--settings", "const:0.2"])
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [row["seed"] for row in rows] == [1234, 7] and rows[0]["best_val_loss"] != rows[1]["best_val_loss"]
    runs = sorted(path.name for path in (tmp_path / "out" / "runs").iterdir())
    assert runs == ["play-1x8-e64-drop-const_0.2-3", "play-1x8-e64-drop-const_0.2-3-seed7"]
