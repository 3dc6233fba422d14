"""TRL plug-in with LoRA: P3OGRPOTrainer trains a PEFT-wrapped tiny Qwen3 given `peft_config` (only the adapters
move), also with a KL reference (TRL then uses the base with the adapters disabled, no second model)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

from datasets import Dataset
from peft import LoraConfig
from test_trl import PROMPTS, build_tokenizer, digit_reward  # same directory: the shared tiny setup
from tiny_lm import make_tiny_lm
from trl import GRPOConfig

from p3o.integrations.trl import P3OGRPOTrainer


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_trains_with_a_peft_config(tmp_path, beta):
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=3,
        num_iterations=2,  # the second optimizer step on a generation batch is off-policy
        learning_rate=5e-2,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        seed=0,
        loss_type="dapo",
        beta=beta,
    )
    trainer = P3OGRPOTrainer(
        model=make_tiny_lm(vocab_size=len(tokenizer)).train(),
        reward_funcs=digit_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    model = trainer.model
    assert hasattr(model, "peft_config")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and changed <= trainable
    assert trainer.ref_model is None  # the reference is the base with adapters disabled
    logs = [h for h in trainer.state.log_history if "objective/ess" in h]
    assert len(logs) == 3
