import numpy as np
import pytest
from tokenizers import Tokenizer

from chargen import ChargenError
from chargen.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, CharTokenizer

UNICODE_TEXT = (
    "Héllo, wörld! Ça va? naïve café\n"  # precomposed accents
    "e\u0301 a\u0308 o\u0303\u0301\n"  # combining marks: each mark is its own code point
    "👍🏽 👨\u200d👩\u200d👧 🇫🇷\n"  # emoji with modifiers, ZWJ sequence, flag
    "中文字符 日本語のテキスト 한국어\r\n"  # CJK and a CRLF line end
    "\ttabbed\tline\r"  # tabs and a lone CR
    "<pad> <unk> are plain text here\n"
)


def test_round_trip_unicode():
    tok = CharTokenizer.from_text(UNICODE_TEXT)
    ids = tok.encode(UNICODE_TEXT)
    assert len(ids) == len(UNICODE_TEXT)  # one token per code point
    assert tok.decode(ids) == UNICODE_TEXT


def hf_tokenizer(text: str) -> Tokenizer:
    """tokenizer.json as Hugging Face's library loads it, set to treat ``<pad>`` etc. in the
    input as plain characters (that flag is not stored in the file)."""
    hf = Tokenizer.from_str(text)
    hf.encode_special_tokens = True
    return hf


def test_fast_path_matches_tokenizer_json(tmp_path):
    tok = CharTokenizer.from_text(UNICODE_TEXT)
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_json(), encoding="utf-8")
    hf = Tokenizer.from_file(str(path))
    hf.encode_special_tokens = True  # chargen's loader sets this: "<pad>" in text is five characters
    assert hf.encode(UNICODE_TEXT).ids == tok.encode(UNICODE_TEXT).tolist()
    assert hf_tokenizer(path.read_text()).encode(UNICODE_TEXT).ids == tok.encode(UNICODE_TEXT).tolist()
    assert hf.decode(tok.encode(UNICODE_TEXT).tolist()) == UNICODE_TEXT


def test_specials_in_hf_file():
    tok = CharTokenizer.from_text("abc")
    hf = hf_tokenizer(tok.to_json())
    assert [hf.token_to_id(s) for s in SPECIALS] == [PAD_ID, UNK_ID, BOS_ID, EOS_ID]
    assert hf.decode([BOS_ID, 4, 5, EOS_ID, PAD_ID], skip_special_tokens=True) == "ab"


def test_json_round_trip():
    tok = CharTokenizer.from_text(UNICODE_TEXT)
    again = CharTokenizer.from_json(tok.to_json())
    assert again.chars == tok.chars
    assert np.array_equal(again.encode(UNICODE_TEXT), tok.encode(UNICODE_TEXT))


def test_decode_drops_specials():
    tok = CharTokenizer.from_text("ab")
    assert tok.decode([BOS_ID, tok.id_of("a"), PAD_ID, tok.id_of("b"), EOS_ID, UNK_ID]) == "ab"


def test_unknown_characters_become_unk_and_are_named():
    tok = CharTokenizer.from_text("abc")
    assert tok.encode("abz").tolist() == [tok.id_of("a"), tok.id_of("b"), UNK_ID]
    assert tok.unknown_chars("zaqz€") == ["z", "q", "€"]
    with pytest.raises(ChargenError, match=r"'z', 'q'"):
        tok.encode_known("zaq", "prime text")


def test_compact_dtypes():
    assert CharTokenizer.from_text("hello").encode("hello").dtype == np.uint8
    wide = "".join(chr(0x4E00 + i) for i in range(1000))
    assert CharTokenizer.from_text(wide).encode(wide).dtype == np.int16


@pytest.mark.parametrize("bad", ["{}", "not json", '{"model": {"type": "BPE", "vocab": {}}}'])
def test_from_json_refuses_other_files(bad):
    with pytest.raises(ChargenError, match="not a chargen character vocabulary"):
        CharTokenizer.from_json(bad)
