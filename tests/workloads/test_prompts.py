"""Prompts of exactly the requested length from real text, deterministic for a seed."""

from __future__ import annotations

import re
import sys

import pytest

from kvbench.errors import WorkloadError
from kvbench.workloads import SyntheticSource, sharegpt
from kvbench.workloads.documents import Document
from kvbench.workloads.prompts import PromptPool, TooLittleText, build_prompt


@pytest.fixture(scope="module")
def conversations():
    return sharegpt.load()


@pytest.mark.parametrize("n", [40, 256, 777, 2048])
def test_multi_turn_prompts_have_exactly_n_tokens(smol_tokenizer, conversations, n):
    pool = PromptPool(conversations, smol_tokenizer, n_prompts=6, seed=0)
    prompts = pool.prompts(n)
    assert len(prompts) == 6
    assert [len(p) for p in prompts] == [n] * 6
    assert len({tuple(p) for p in prompts}) == 6  # distinct
    text = smol_tokenizer.decode(prompts[0])
    assert text.startswith("<|im_start|>system\n")


def test_single_turn_prompt_ends_with_the_generation_prompt(smol_tokenizer, conversations):
    pool = PromptPool(conversations, smol_tokenizer, n_prompts=3, seed=1, max_turns=1)
    for p in pool.prompts(300):
        assert len(p) == 300
        text = smol_tokenizer.decode(p)
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert text.count("<|im_start|>user\n") == 1 and "<|im_start|>assistant\n" not in text[:-30]


def test_trimmed_assistant_turn_is_continued(smol_tokenizer):
    doc = Document("d", (("user", "Name three colours."), ("assistant", "Red, green and blue are three " * 20)))
    ids = build_prompt(smol_tokenizer, doc, 60)
    assert len(ids) == 60
    text = smol_tokenizer.decode(ids)
    assert "<|im_start|>assistant\nRed, green" in text and not text.endswith("<|im_end|>\n")


def test_same_seed_same_prompts_other_seed_other_prompts(smol_tokenizer, conversations):
    a = PromptPool(conversations, smol_tokenizer, n_prompts=4, seed=7).batch(128, 2, repeat=0)
    b = PromptPool(conversations, smol_tokenizer, n_prompts=4, seed=7).batch(128, 2, repeat=0)
    c = PromptPool(conversations, smol_tokenizer, n_prompts=4, seed=8).batch(128, 2, repeat=0)
    assert a == b and a != c


def test_repeats_rotate_through_the_pool(smol_tokenizer, conversations):
    pool = PromptPool(conversations, smol_tokenizer, n_prompts=3, seed=0)
    p = pool.prompts(64)
    assert pool.batch(64, 2, repeat=0) == [p[0], p[1]]
    assert pool.batch(64, 2, repeat=1) == [p[2], p[0]]


def test_too_little_text_says_so(smol_tokenizer):
    # the template around one user turn is 30 tokens; these texts add 11 and 12
    docs = [Document("short", (("user", "Just a few words to make a short prompt here."),)),
            Document("s2", (("user", "Another line of text, a little longer than the first."),))]
    pool = PromptPool(docs, smol_tokenizer, n_prompts=4, source_name="workload files '*.txt'")
    assert [len(p) for p in pool.batch(40, 2, 0)] == [40, 40]
    with pytest.raises(TooLittleText) as info:
        pool.batch(500, 1, 0)
    assert str(info.value) == (
        "workload files '*.txt': only 0 of 2 texts reach 500 tokens; a batch of 1 needs 1 "
        "(use shorter prompt_tokens, a smaller batch, more text, or order: longest)"
    )


def test_language_filter_keeps_only_that_language(smol_tokenizer):
    from langdetect import detect

    docs = [Document("en", (("user", "The weather is lovely today and we are going for a long walk. " * 8),)),
            Document("de", (("user", "Das Wetter ist heute schön und wir machen einen langen Spaziergang. " * 8),))]
    pool = PromptPool(docs, smol_tokenizer, n_prompts=2, language="de")
    prompts = pool.prompts(50)
    assert len(prompts) == 1 and detect(smol_tokenizer.decode(prompts[0])) == "de"


def test_a_language_filter_without_langdetect_says_how_to_install_it(smol_tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "langdetect", None)  # as if not installed: its import raises ImportError
    docs = [Document("en", (("user", "The weather is lovely today and we are going for a long walk. " * 8),))]
    with pytest.raises(WorkloadError, match=re.escape("workload.language needs langdetect, which is not installed: "
                                                      "it is kvbench's optional 'lang' extra, pip install "
                                                      "'kvbench[lang]'")):
        PromptPool(docs, smol_tokenizer, n_prompts=1, language="en").prompts(50)


def test_synthetic_prompts_are_seeded_and_avoid_special_ids():
    src = SyntheticSource(vocab_size=50, seed=3, n_prompts=3, exclude=frozenset(range(10)))
    a = src.batch(100, 2, repeat=1)  # prompts 2 and 0
    assert a == SyntheticSource(50, 3, 3, frozenset(range(10))).batch(100, 2, repeat=1)
    assert [len(p) for p in a] == [100, 100] and a[0] != a[1]
    assert a[1] == src.batch(100, 1, repeat=0)[0]
    assert all(10 <= t < 50 for p in a for t in p)
    with pytest.raises(TooLittleText, match="n_prompts 3 cannot fill a batch of 4"):
        src.batch(10, 4, 0)
