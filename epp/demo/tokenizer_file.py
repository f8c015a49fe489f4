"""A real `tokenizer.json` built offline, for simulated servers and an EPP to share.

The simulated servers tokenize with a stand-in (`server_formats.token_ids`,
four characters a token), which only their own render endpoints can
reproduce. With a `tokenizer.json` that the servers and the EPP's local
token producer (`token-producer`'s `local.modelDir`) both load, the EPP
tokenizes in process, as the servers do, and its block keys match the
ones the servers' KV events carry.

`train(folder, corpus)` trains a byte-level BPE on the corpus (the
`tokenizers` library, no download) over pieces of at most four characters,
so that a text counts about as many tokens as the simulated tokenizer (and
a scenario's token counts) say, and saves `folder/tokenizer.json`;
`encoder(folder)` is the encode the servers and the local backend both
run (`epp.serve.tokenizer.LocalTokenizer.encode`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from epp.demo.server_formats import CHARS_PER_TOKEN

DEFAULT_VOCABULARY = 4096


def train(folder: Path, corpus: Iterable[str], vocabulary: int = DEFAULT_VOCABULARY) -> Path:
    """Train a byte-level BPE of `vocabulary` tokens on `corpus`, save it as
    `folder/tokenizer.json`; `folder` (a model directory)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(f".{{1,{CHARS_PER_TOKEN}}}"), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocabulary,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def encoder(folder: Path) -> Callable[[str], list[int]]:
    """The token ids of a text under `folder/tokenizer.json`, as the EPP's
    local backend computes them."""
    from epp.serve.tokenizer import LocalTokenizer

    return LocalTokenizer(str(folder), workers=1).encode
