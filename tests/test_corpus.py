import errno
import hashlib
import tracemalloc

import numpy as np
import pytest

from chargen import ChargenError, lines, load_corpus, textfile, train
from chargen import corpus as corpus_module
from chargen.corpus import Streams, batchify, chunk_length
from chargen.textfile import iter_text, read_text, scan_text
from chargen.tokenizer import CharTokenizer
from conftest import make_text, name_list, tiny_model, tiny_train


def test_streams_continue_across_chunks():
    ids = np.arange(1000) % 251
    ids_u8 = ids.astype(np.uint8)
    streams = Streams(batchify(ids_u8, n_streams=7))
    length = 1000 // 7
    position, xs, ys = 0, [], []
    while not streams.finished(position):
        x, y = streams.chunk(position, 10)
        if xs:  # chunk k+1 starts exactly where chunk k ended, in every stream
            assert np.array_equal(x[0].numpy(), (ys[-1][-1]).numpy())
        xs.append(x)
        ys.append(y)
        position += x.shape[0]
    inputs, targets = np.concatenate(xs), np.concatenate(ys)
    assert np.shares_memory(streams.data.numpy(), ids_u8)  # a view of the ids, not a copy
    for j in range(7):  # stream j is the j-th contiguous piece of the text, used whole
        piece = ids[j * length : (j + 1) * length]
        assert np.array_equal(inputs[:, j], piece[:-1])
        assert np.array_equal(targets[:, j], piece[1:])


def test_last_chunk_is_shorter():
    streams = Streams(batchify(np.arange(44, dtype=np.uint8), n_streams=2))  # 22 rows
    x, y = streams.chunk(16, 10)
    assert x.shape == (5, 2) and y.shape == (5, 2)
    assert streams.finished(21)


def test_variable_bptt_is_seeded_and_bounded():
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    a = [chunk_length(rng_a, 64, True) for _ in range(500)]
    b = [chunk_length(rng_b, 64, True) for _ in range(500)]
    assert a == b
    assert min(a) >= 16 and max(a) <= 128 and len(set(a)) > 5
    assert abs(np.mean(a) - 62.4) < 3  # 95% around 64, 5% around 32
    assert chunk_length(np.random.default_rng(0), 64, False) == 64


def test_validation_split(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("x" * 900 + "y" * 100)
    corpus = load_corpus(path, val_fraction=0.1)
    decode = corpus.tokenizer.decode
    assert decode(corpus.train_ids) == "x" * 900 and decode(corpus.val_ids) == "y" * 100
    assert corpus.source["chars"] == 1000
    val = tmp_path / "v.txt"
    val.write_text("held out")
    corpus = load_corpus(path, val_path=val)
    decode = corpus.tokenizer.decode
    assert decode(corpus.train_ids) == "x" * 900 + "y" * 100 and decode(corpus.val_ids) == "held out"
    assert corpus.tokenizer.chars == sorted(set("xyheld out"))  # both files' characters


def test_validation_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "MAX_VAL_CHARS", 50)
    path = tmp_path / "t.txt"
    path.write_text("abc" * 1000)
    corpus = load_corpus(path, val_fraction=0.1)  # 10% would be 300
    assert len(corpus.val_ids) == 50 and len(corpus.train_ids) == 2950


def test_read_text_errors(tmp_path):
    with pytest.raises(ChargenError, match="no such file"):
        read_text(tmp_path / "missing.txt")
    with pytest.raises(ChargenError, match="is a directory"):
        read_text(tmp_path)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ChargenError, match="is empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "bad.txt").write_bytes(b"line one\nline two \xff\xfe here\n")
    with pytest.raises(ChargenError, match=r"byte 0xff at offset 18 \(line 2\).*--encoding.*--errors replace"):
        read_text(tmp_path / "bad.txt")
    assert read_text(tmp_path / "bad.txt", encoding="latin-1").endswith("here\n")
    assert "\ufffd" in read_text(tmp_path / "bad.txt", errors="replace")


def test_byte_order_mark_is_dropped(tmp_path):
    (tmp_path / "bom.txt").write_bytes("\ufeffhello".encode("utf-8"))
    assert read_text(tmp_path / "bom.txt") == "hello"


MIXED = "Ünïcödé ≠ ascii: 日本語 and 😀 emoji, one\r\nline break\n" * 7 + "end"


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 64, 1 << 20])
def test_text_in_pieces_is_the_whole_text(tmp_path, chunk_bytes):
    """Characters split between chunks (up to 4 UTF-8 bytes) come out whole."""
    path = tmp_path / "t.txt"
    path.write_bytes(("\ufeff" + MIXED).encode("utf-8"))
    pieces = list(iter_text(path, chunk_bytes=chunk_bytes))
    assert "".join(pieces) == MIXED
    assert len(pieces) >= min(100, len(MIXED.encode()) // chunk_bytes)


def test_a_stream_is_encoded_in_chunks(tmp_path, monkeypatch):
    """Chunk by chunk, memory-mapped or not, the ids, vocabulary and hash are those of the
    whole text at once."""
    path = tmp_path / "t.txt"
    path.write_text(MIXED * 20, encoding="utf-8")
    whole = path.read_bytes().decode("utf-8")
    reference = CharTokenizer.from_text(whole)
    for chunk_bytes, memmap_min in ((7, 0), (1 << 24, 1 << 28)):
        monkeypatch.setattr(textfile, "CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(textfile, "MEMMAP_MIN_BYTES", memmap_min)
        corpus = load_corpus(path, val_fraction=0.1)
        assert isinstance(corpus.train_ids.base, np.memmap) == (memmap_min == 0)
        assert corpus.tokenizer.chars == reference.chars
        ids = np.concatenate([corpus.train_ids, corpus.val_ids])
        assert np.array_equal(ids, reference.encode(whole)) and ids.dtype == np.uint8
        assert corpus.source["sha256"] == hashlib.sha256(whole.encode()).hexdigest()[:16]
        assert corpus.source["chars"] == len(whole)


def test_loading_never_holds_the_whole_text(tmp_path, monkeypatch):
    """Peak memory while loading an 8 MB file read in 1 MB chunks (and its lines found 1 M
    ids at a time): the ids (8 MB), a few chunks and, in lines mode, the items' index
    arrays. Held as one string, the text alone would be 8 MB more, and its code points 32."""
    monkeypatch.setattr(textfile, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(lines, "ID_WINDOW", 1 << 20)
    path = tmp_path / "t.txt"
    path.write_text(make_text() * (8 * 2**20 // len(make_text()) + 1), encoding="utf-8")
    size = path.stat().st_size
    for mode in ("stream", "lines"):
        tracemalloc.start()
        try:
            corpus = load_corpus(path, mode=mode)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert corpus.source["chars"] == size
        index_bytes = 100 * corpus.source["items"] if mode == "lines" else 0  # starts, lengths, the split
        assert peak < size + 12 * 2**20 + index_bytes, f"{mode}: {peak / 2**20:.1f} MB for {size / 2**20:.1f} MB"


def test_training_reads_memory_mapped_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(textfile, "MEMMAP_MIN_BYTES", 0)
    path = tmp_path / "t.txt"
    path.write_text(make_text(), encoding="utf-8")
    corpus = load_corpus(path)
    assert isinstance(corpus.train_ids.base, np.memmap)
    result = train(corpus, tmp_path / "run", tiny_model(), tiny_train(steps=4, eval_every=2))
    assert result.step == 4 and result.best_val_loss > 0


def test_no_room_for_the_memory_map_is_a_clear_error(tmp_path, monkeypatch):
    def full_disk(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(textfile, "MEMMAP_MIN_BYTES", 0)
    monkeypatch.setattr(textfile.os, "posix_fallocate", full_disk)
    path = tmp_path / "t.txt"
    path.write_text("abc" * 1000)
    with pytest.raises(ChargenError, match="cannot make a .* temporary file .*No space left on device.*TMPDIR"):
        load_corpus(path)


def test_decode_errors_name_the_place_in_a_big_file(tmp_path, monkeypatch):
    monkeypatch.setattr(textfile, "CHUNK_BYTES", 16)
    path = tmp_path / "bad.txt"
    path.write_bytes(b"line\n" * 20 + "é".encode() + b"ok \xff\n")
    with pytest.raises(ChargenError, match=r"byte 0xff at offset 105 \(line 21\)"):
        load_corpus(path)
    path.write_bytes(b"abc\n" * 10 + "é".encode()[:1])  # cut off in the middle of a character
    with pytest.raises(ChargenError, match=r"byte 0xc3 at offset 40 \(line 11\)"):
        scan_text(path)


def test_mode_is_judged_from_the_head_of_a_big_file(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "DETECT_CHARS", 500)
    path = tmp_path / "names.txt"
    path.write_text("\n".join(name_list() * 3) + "\n")
    corpus = load_corpus(path, mode="auto")
    assert corpus.mode == "lines" and "judged from its first" in corpus.source["mode_reason"]
