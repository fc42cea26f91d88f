"""Many files, or folders, as one corpus: each file a document in stream mode (a document
break after it, validation from the tail of every file), items pooled in lines mode, hidden
files and files that are not text left out with a line each, read in chunks, and a resume
that checks the set of files and their contents."""

import json

import numpy as np
import pytest

from chargen import ChargenError, checkpoint, load_corpus, textfile, train
from chargen.cli import main
from chargen.corpus import DOCUMENT_END
from conftest import make_text, name_list, tiny_model, tiny_train


@pytest.fixture
def folder(tmp_path):
    """Three texts (one in a subfolder, one with characters the others lack), a hidden file,
    a hidden folder, a binary file and an empty one."""
    root = tmp_path / "texts"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "b.txt").write_text(make_text(150, seed=2), encoding="utf-8")
    (root / "a.txt").write_text(make_text(150, seed=1), encoding="utf-8")
    (root / "sub" / "c.txt").write_text(make_text(150, seed=3) + "Ünïcode ends here", encoding="utf-8")
    (root / ".notes.txt").write_text("hidden", encoding="utf-8")
    (root / ".git" / "HEAD").write_text("ref", encoding="utf-8")
    (root / "logo.png").write_bytes(bytes(range(256)) * 4)
    (root / "empty.txt").write_bytes(b"")
    return root


def test_a_folders_files_are_documents_each_ended_by_a_break_with_validation_from_each(folder):
    corpus = load_corpus(folder, mode="stream", val_fraction=0.1)
    files = [folder / "a.txt", folder / "b.txt", folder / "sub" / "c.txt"]
    assert [f["path"] for f in corpus.source["files"]] == [str(f) for f in files]
    assert corpus.source["skipped"] == [f"skipped {folder / '.git'}/: a hidden folder",
                                        f"skipped {folder / '.notes.txt'}: a hidden file",
                                        f"skipped {folder / 'empty.txt'}: empty",
                                        f"skipped {folder / 'logo.png'}: not text (it holds NUL bytes)"]
    texts = [f.read_text(encoding="utf-8") for f in files]
    tails = [round(len(t) * 0.1) for t in texts]
    decode = corpus.tokenizer.decode
    train_docs = np.split(corpus.train_ids, np.flatnonzero(corpus.train_ids == DOCUMENT_END) + 1)[:-1]
    val_docs = np.split(corpus.val_ids, np.flatnonzero(corpus.val_ids == DOCUMENT_END) + 1)[:-1]
    assert [decode(d[:-1]) for d in train_docs] == [t[: len(t) - n] for t, n in zip(texts, tails, strict=True)]
    assert [decode(d[:-1]) for d in val_docs] == [t[len(t) - n :] for t, n in zip(texts, tails, strict=True)]
    assert all(d[-1] == DOCUMENT_END for d in train_docs + val_docs)


def test_files_and_folders_read_in_small_chunks_give_the_same_ids(folder, tmp_path, monkeypatch):
    extra = tmp_path / "extra.txt"
    extra.write_text("Ωmega " * 50, encoding="utf-8")
    whole = load_corpus([extra, folder], mode="stream")
    monkeypatch.setattr(textfile, "CHUNK_BYTES", 7)  # (chunks straddle every boundary: head, tail, file)
    chunked = load_corpus([extra, folder], mode="stream")
    assert np.array_equal(whole.train_ids, chunked.train_ids) and np.array_equal(whole.val_ids, chunked.val_ids)
    assert [f["path"] for f in whole.source["files"]][0] == str(extra)
    assert load_corpus([folder, folder / "a.txt"], mode="stream").source["files"] == \
        load_corpus(folder, mode="stream").source["files"]  # (a file named twice is read once)


def test_lines_mode_pools_the_items_of_every_file(tmp_path):
    root = tmp_path / "lists"
    root.mkdir()
    first, second = name_list(120, seed=1), name_list(80, seed=2)
    (root / "one.txt").write_text("\n".join(first), encoding="utf-8")  # (no final line break)
    (root / "two.txt").write_text("\n".join(second) + "\n", encoding="utf-8")
    corpus = load_corpus(root, mode="lines")
    items = list(corpus.train_items.strings(corpus.tokenizer)) + list(corpus.val_items.strings(corpus.tokenizer))
    assert sorted(items) == sorted(first + second)
    assert corpus.source["items"] == 200 and len(corpus.source["files"]) == 2


def test_resume_checks_the_set_of_files_and_their_contents(folder, tmp_path):
    config = tiny_train(steps=6, eval_every=3, sample_chars=0)
    train(load_corpus(folder, mode="stream"), tmp_path / "run", tiny_model(), config)
    resumed = train(load_corpus(folder, mode="stream"), tmp_path / "run", None, tiny_train(steps=8, eval_every=3,
                                                                                          sample_chars=0), resume=True)
    assert resumed.step == 8
    (folder / "d.txt").write_text(make_text(50, seed=4), encoding="utf-8")
    with pytest.raises(ChargenError, match="different text"):
        train(load_corpus(folder, mode="stream"), tmp_path / "run", None, config, resume=True)
    (folder / "d.txt").unlink()
    (folder / "a.txt").write_text(make_text(150, seed=5), encoding="utf-8")
    with pytest.raises(ChargenError, match="different text"):
        train(load_corpus(folder, mode="stream"), tmp_path / "run", None, config, resume=True)


def test_the_cli_trains_on_files_and_folders_and_names_what_it_skips(folder, tmp_path, capsys):
    single = tmp_path / "single.txt"
    single.write_text(make_text(100, seed=7), encoding="utf-8")
    flags = ["--hidden", "24", "--embedding", "8", "--batch-size", "4", "--bptt", "16", "--steps", "4",
             "--eval-every", "4", "--device", "cpu", "--quiet", "--mode", "stream"]
    assert main(["train", str(single), str(folder), "--out", str(tmp_path / "run"), *flags]) == 0
    err = capsys.readouterr().err
    assert f"skipped {folder / 'logo.png'}: not text (it holds NUL bytes)" in err
    assert "corpus: 4 files" in err and "each a document, ended by a document break" in err
    saved = json.loads((tmp_path / "run" / checkpoint.CONFIG).read_text())
    assert len(saved["corpus"]["files"]) == 4
    nothing = tmp_path / "nothing"
    (nothing / ".hidden").mkdir(parents=True)
    assert main(["train", str(nothing), "--out", str(tmp_path / "none"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no text files to train on" in err[0] and not (tmp_path / "none").exists()


def test_pipes_are_never_opened_and_a_folder_above_the_texts_is_refused(folder, monkeypatch):
    import os

    from chargen import corpus

    os.mkfifo(folder / "pipe.txt")  # (opening it to read would block for ever)
    assert f"skipped {folder / 'pipe.txt'}: not a regular file" in load_corpus(folder, mode="stream").source["skipped"]
    monkeypatch.setattr(corpus, "MAX_FOLDER_FILES", 5)
    with pytest.raises(ChargenError, match="holds more than 5 files; give the folder of your texts"):
        load_corpus(folder.parent, mode="stream")
