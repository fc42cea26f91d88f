import numpy as np
import pytest

from chargen import ChargenError, load_corpus
from chargen.corpus import Streams, batchify, chunk_length, read_text


def test_streams_continue_across_chunks():
    ids = np.arange(1000) % 251
    streams = Streams(batchify(ids.astype(np.uint8), n_streams=7))
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
    assert corpus.train == "x" * 900 and corpus.val == "y" * 100
    assert corpus.source["chars"] == 1000
    val = tmp_path / "v.txt"
    val.write_text("held out")
    corpus = load_corpus(path, val_path=val)
    assert corpus.train == "x" * 900 + "y" * 100 and corpus.val == "held out"


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
