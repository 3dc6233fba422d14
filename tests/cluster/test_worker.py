"""The rollout worker in-process (no Ray): what in-flight updates do to one response, without timing."""

from __future__ import annotations

from cluster_args import ray_args

from p3o.cluster.worker import RolloutWorker
from p3o.config import load_config, to_dict


def test_a_version_published_mid_response_stamps_the_later_tokens(tmp_path):
    cfg = load_config(ray_args(tmp_path / "w", **{"rollout.inflight_updates": True, "rollout.max_new_tokens": 12}))
    worker = RolloutWorker(to_dict(cfg), worker_id=0, threads=1)
    w0 = {k: v.detach().clone() for k, v in worker.model.state_dict().items()}
    w1 = {k: v + 0.01 if v.is_floating_point() else v for k, v in w0.items()}
    take_newer = worker.engine.on_decode_step
    assert take_newer is not None  # inflight_updates installs the hook

    def publish_at_step_3(t: int) -> None:  # the trainer's push, landing between decode steps 3 and 4
        if t == 3:
            worker.publish(1, [w1])
        take_newer(t)

    worker.engine.on_decode_step = publish_at_step_3
    state, _, _ = worker.produce(index=0, version=0, weights=[w0])
    version, mask = state["policy_version"], state["mask"]
    stamped = version[mask]
    assert set(stamped.tolist()) == {0, 1}  # both versions sampled tokens of this batch
    long = mask.sum(1) > 4
    assert long.any()
    # within each response the stamp never goes back, and every response long enough holds both versions
    masked = version.masked_fill(~mask, 1 << 30)
    assert bool((masked[:, 1:] >= version[:, :-1].masked_fill(~mask[:, :-1], -1)).all())
    assert bool((version.masked_fill(~mask, -1).max(1).values[long] == 1).all())
    assert bool((version.masked_fill(~mask, 1 << 30).min(1).values[long] == 0).all())
    assert worker.engine.version == 1  # the engine holds the newer version for the next batch
