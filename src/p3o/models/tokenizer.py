"""The built-in tokenizer: byte-level BPE trained locally (the `tokenizers` library) on the task's own text.

Digits are split one per token (so the model sees place value), the vocabulary is small (default 512), and the
chat template is ChatML-style with `<|im_end|>` as end-of-sequence:

    <|im_start|>user\\nWhat is 3 + 4?<|im_end|>\\n<|im_start|>assistant\\n3 + 4 = 7\\n#### 7<|im_end|>

    tok = build_tokenizer()            # deterministic: same text, same merges
    tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, IM_START, ENDOFTEXT = "<|pad|>", "<|bos|>", "<|im_end|>", "<|im_start|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, ENDOFTEXT]  # ids 0..4: pad=0, bos=1, eos=2 (like the test fixture)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a transformers fast tokenizer with the chat template.

    The 256 byte symbols are always in the vocabulary, so any text round-trips; `vocab_size` counts them, the
    special tokens and the learned merges.
    """
    # pinned: the base's cache key hashes this module's syntax tree (p3o.models.tiny): moving it rebuilds the base
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(
            f"vocab_size must be > {256 + len(SPECIAL_TOKENS)} (bytes + special tokens), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=[IM_START, ENDOFTEXT],
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def task_corpus(task: str = "arithmetic", seed: int = 0, n_per_level: int = 400) -> list[str]:
    """Chat-formatted prompts + solutions of the built-in task at every level (the tokenizer's training text)."""
    # pinned: the base's cache key hashes this module's syntax tree (p3o.models.tiny): moving it rebuilds the base
    from p3o.tasks import load_task
    from p3o.tasks.arithmetic import LEVELS
    from p3o.tasks.prompts import user_message

    if task != "arithmetic":
        raise ValueError(f"the built-in tokenizer is trained on the 'arithmetic' task only, got {task!r}")
    texts = []
    for level in LEVELS:
        for p in load_task(task, "train", seed=seed, n=n_per_level, difficulty=level):
            texts.append(f"{IM_START}user\n{user_message(p)}{EOS}\n{IM_START}assistant\n{p.solution}{EOS}\n")
    return texts


def build_tokenizer(task: str = "arithmetic", vocab_size: int = 512, seed: int = 0) -> PreTrainedTokenizerFast:
    """The built-in tokenizer for `task` (deterministic in its arguments)."""
    return train_tokenizer(task_corpus(task, seed=seed), vocab_size=vocab_size)
