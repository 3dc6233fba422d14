"""One rank of the two-process TRL check (run by test_trl.py with torchrun, gloo on CPU).

Each rank builds a P3OGRPOTrainer (accelerate sees WORLD_SIZE=2), computes ``_compute_loss`` on its half of an
off-policy micro-batch and writes ``{"ess": logged objective/ess, "ref_full": ESS of the whole batch,
"ref_half": ESS of its own half}`` to ``OUT_DIR/rank<r>.json``.

    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/trl_ddp_worker.py OUT_DIR
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from test_trl import build_tokenizer, fake_batch, make_trainer  # noqa: E402

from p3o.objectives import effective_sample_size  # noqa: E402


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    tok = build_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(tok, Path(tmp), objective="p3o")
    assert trainer.accelerator.num_processes == 2, trainer.accelerator.num_processes
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    full = fake_batch(tok, n=6)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([full["prompt_ids"], full["completion_ids"]], 1),
            torch.cat([full["prompt_mask"], full["completion_mask"]], 1),
            full["completion_ids"].shape[1],
        )
    old = logp + 0.5 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(11))
    mask = full["completion_mask"].bool()
    rows = slice(3 * rank, 3 * rank + 3)
    half = {k: (v[rows] if k != "num_items_in_batch" else v) for k, v in full.items()}
    half["old_per_token_logps"] = old[rows]
    trainer._compute_loss(trainer.model, half)
    result = {
        "ess": trainer._metrics["train"]["objective/ess"][-1],
        "ref_full": effective_sample_size(logp - old, mask, sync=False).item(),
        "ref_half": effective_sample_size((logp - old)[rows], mask[rows], sync=False).item(),
    }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    trainer.accelerator.wait_for_everyone()
    del trainer  # its DDP reducer goes while the group is up (freed after destroy, gloo's destructor can hang)
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
