"""`frame_pairs` (issue 66 item 1): a tokenizer whose pair template puts nothing between the two texts (GPT-2's
byte-level one: tokenizer(a, b) = `a b`) gets `a <|endoftext|> b`, kept through save_pretrained and a reload in a
fresh tokenizer, with single texts and their offsets as before; tokenizers that frame pairs already are left alone,
and one with no separator token is reported, not guessed at."""

from __future__ import annotations

from transformers import AutoTokenizer

from data_pipeline.tokenizers import frame_pairs, pair_frame
from tests.adapt.tiny_text import word_tokenizer
from tests.hf_folder import tokenizer_of

A, B = "Markets rallied as shares rose.", "The team won the final."


def test_a_gpt2_tokenizer_gets_its_end_of_text_token_between_a_pairs_texts(tmp_path):
    tok = tokenizer_of()
    single = tok(A, return_offsets_mapping=True)
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in (A, B))
    assert tok(A, B)["input_ids"] == a + b  # the issue: nothing tells the model where `a` ends
    assert frame_pairs(tok)
    assert tok(A, B)["input_ids"] == a + [tok.eos_token_id] + b
    assert pair_frame(tok) == ([], [tok.eos_token_id], [])
    assert tok(A, return_offsets_mapping=True) == single  # one text: the same ids and trimmed offsets
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert again(A, B)["input_ids"] == a + [tok.eos_token_id] + b and again(A)["input_ids"] == a
    # longest-first truncation keeps the separator
    cut = again(A, B, truncation=True, max_length=6)["input_ids"]
    assert len(cut) == 6 and tok.eos_token_id in cut
    assert frame_pairs(again) and again(A, B)["input_ids"] == a + [tok.eos_token_id] + b  # once only


def test_tokenizers_that_frame_pairs_are_left_alone_and_none_without_a_separator_is_guessed(tmp_path):
    from tokenizers import processors

    tok = tokenizer_of()
    eot = tok.eos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A", pair=f"$A {tok.eos_token} {tok.eos_token} $B", special_tokens=[(tok.eos_token, eot)]
    )
    before = tok.backend_tokenizer.to_str()
    assert frame_pairs(tok) and tok.backend_tokenizer.to_str() == before
    words = word_tokenizer()  # [PAD] and [UNK] only: no sep or eos token to put between the texts
    assert not frame_pairs(words)
    assert words("w1 w2", "w3")["input_ids"] == words("w1 w2 w3")["input_ids"]
