"""p3o.config: defaults, dotted overrides, nearest-name errors, value checks, YAML round trip, presets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

import p3o.config as config_mod
from p3o.config import (
    TrainConfig,
    apply_overrides,
    config_help,
    default_preset_text,
    from_dict,
    list_presets,
    load_config,
    objective_hyper,
    preset_path,
    save_config,
    to_dict,
    validate,
)
from p3o.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
MY_PRESETS = ["default", "quick", "grpo", "stale", "async", "fp8-rollout"]

# The keys docs/contracts.md fixes (p3o.experiments expresses its regimes with exactly these).
CONTRACT_KEYS = [
    "run_dir",
    "seed",
    "steps",
    "model.name",
    "task.name",
    "task.difficulty",
    "rollout.prompts_per_step",
    "rollout.group_size",
    "rollout.max_new_tokens",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.top_k",
    "rollout.precision",
    "rollout.logprob_mode",
    "train.temperature",
    "update.num_mini_batches",
    "update.micro_batch_size",
    "update.epochs",
    "optim.lr",
    "optim.warmup_steps",
    "optim.schedule",
    "optim.grad_clip",
    "loop.mode",
    "loop.staleness",
    "loop.max_lag",
    "loop.dynamic_sampling",
    "objective.name",
]


def _leaf_keys() -> list[str]:
    return [k for k, _, _ in config_mod._leaf_fields()]


def test_defaults_are_valid_and_every_field_has_help():
    cfg = TrainConfig()
    assert validate(cfg) is cfg
    assert load_config() == cfg and load_config([]) == cfg
    for key, f, _ in config_mod._leaf_fields():
        assert f.metadata.get("help"), key
    assert set(CONTRACT_KEYS) <= set(_leaf_keys())
    # The embedded default job: P3O, built-in task, built-in tiny model.
    assert (cfg.objective.name, cfg.task.name, cfg.model.name, cfg.run_dir) == (
        "p3o",
        "arithmetic",
        "tiny",
        "runs/default",
    )


def test_dotted_overrides_both_forms_and_types():
    cfg = load_config(
        [
            "--optim.lr",
            "3e-4",  # YAML 1.1 reads this as a string: the float field converts it
            "--rollout.group_size=4",
            "--loop.mode",
            "stale",
            "--optim.betas",
            "[0.8, 0.95]",
            "--run_dir",
            "007",  # a str field keeps the text verbatim, not the YAML int 7
            "--task.n_train",
            "null",
            "--rollout.temperature=1",  # int literal into a float field
        ]
    )
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.rollout.group_size == 4 and isinstance(cfg.rollout.group_size, int)
    assert cfg.loop.mode == "stale"
    assert cfg.optim.betas == (0.8, 0.95)
    assert cfg.run_dir == "007"
    assert cfg.task.n_train is None
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)
    # Later overrides win; a bare boolean flag means true; --resume sets ckpt.resume.
    cfg = load_config(["--seed", "1", "--seed=2", "--loop.dynamic_sampling", "--resume"])
    assert cfg.seed == 2 and cfg.loop.dynamic_sampling is True and cfg.ckpt.resume is True
    assert load_config(["--loop.dynamic_sampling", "false", "--resume=no"]).ckpt.resume is False
    # Unions: bool or "auto"; int or str.
    assert load_config(["--log.tensorboard", "false"]).log.tensorboard is False
    assert load_config(["--log.wandb=auto"]).log.wandb == "auto"
    assert load_config(["--task.difficulty", "3"]).task.difficulty == 3
    assert load_config(["--task.difficulty", "hard"]).task.difficulty == "hard"


def test_base_is_not_mutated():
    base = TrainConfig(steps=7)
    cfg = load_config(["--optim.lr", "0.5"], base=base)
    assert cfg.steps == 7 and cfg.optim.lr == 0.5 and base.optim.lr == TrainConfig().optim.lr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--optim.lrr", "1"], "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
        (["--rollout.groupsize", "2"], "unknown key 'rollout.groupsize' (did you mean 'rollout.group_size'?)"),
        (["--group_size", "2"], "unknown key 'group_size' (did you mean 'rollout.group_size'?)"),
        (["--optim.lr", "abc"], "optim.lr: expected a float, got 'abc'"),
        (["--rollout.group_size", "2.5"], "rollout.group_size: expected an int, got '2.5'"),
        (
            ["--rollout.precision", "fp9"],
            "rollout.precision: expected one of fp32, bf16, fp16, int8, fp8, fp8-tensor, got 'fp9'",
        ),
        (["--loop.mode", "lazy"], "loop.mode: expected one of sync, stale, async, reuse, got 'lazy'"),
        (["--optim.lr", "0"], "optim.lr: must be > 0, got 0.0"),
        (["--optim.lr=-1e-3"], "optim.lr: must be > 0, got -0.001"),
        (["--rollout.group_size", "0"], "rollout.group_size: must be >= 1, got 0"),
        (["--rollout.top_p", "1.5"], "rollout.top_p: must be <= 1, got 1.5"),
        (["--loop.dynamic_sampling", "maybe"], "loop.dynamic_sampling: expected a bool, got 'maybe'"),
        (["--optim.betas", "[0.9]"], "optim.betas: expected a list of 2 floats, got '[0.9]'"),
        (["--optim.betas", "[0.9, 1.0]"], "optim.betas: each beta must be in [0, 1), got [0.9, 1.0]"),
        (["--optim.lr"], "--optim.lr: expected a value"),
        (["--optim"], "optim: is a section; set its keys, e.g. 'optim.lr'"),
        (["stale"], "unexpected argument 'stale'"),
        (["--config", "no-such-preset"], "--config: no file or preset named 'no-such-preset'"),
        (["--update.num_mini_batches", "100"], "update.num_mini_batches: 100 mini-batches but only 64 sequences"),
    ],
)
def test_errors_are_one_line_and_name_the_key(argv, message):
    with pytest.raises(ConfigError) as err:
        load_config(argv)
    text = str(err.value)
    assert message in text, text
    assert "\n" not in text


def test_objective_hyper_parameters_are_flat_keys_checked_against_the_signature():
    cfg = load_config(["--objective.name", "grpo", "--objective.clip_eps", "0.4", "--objective.ref_kl_coef=0"])
    assert cfg.objective.name == "grpo"
    assert cfg.objective.hyper == {"clip_eps": 0.4, "ref_kl_coef": 0.0}
    full = objective_hyper(cfg.objective)
    assert full["clip_eps"] == 0.4 and "agg" in full  # the objective's defaults fill the rest
    # int into a float hyper-parameter becomes float (the type of the default)
    assert load_config(["--objective.name=grpo", "--objective.clip_eps=1"]).objective.hyper["clip_eps"] == 1.0
    # Order does not matter: hyper-parameters are validated once the whole config is known.
    assert load_config(["--objective.clip_eps=0.3", "--objective.name=grpo"]).objective.hyper == {"clip_eps": 0.3}
    with pytest.raises(ConfigError, match=r"unknown key 'objective.clip_eps' for objective 'p3o'.*belongs to .*grpo"):
        load_config(["--objective.clip_eps", "0.4"])  # P3O has no clip range
    with pytest.raises(ConfigError, match=r"unknown key 'objective.clip_epss'.*did you mean 'objective.clip_eps'"):
        load_config(["--objective.name", "grpo", "--objective.clip_epss", "0.4"])
    with pytest.raises(ConfigError, match=r"objective.clip_eps: expected a float, got 'wide'"):
        load_config(["--objective.name", "grpo", "--objective.clip_eps", "wide"])
    with pytest.raises(ConfigError, match=r"objective.name: unknown objective 'grpoo' \(did you mean 'grpo'\?\)"):
        load_config(["--objective.name", "grpoo"])
    # Types come from the objective's annotations; string options from the choice sets p3o.objectives exports.
    with pytest.raises(ConfigError, match=r"objective.agg: expected one of token-mean, .*got 'tokenmean'"):
        load_config(["--objective.agg", "tokenmean"])
    with pytest.raises(ConfigError, match=r"objective.clip_eps_low: expected a float or null, got 'abc'"):
        load_config(["--objective.name=grpo", "--objective.clip_eps_low=abc"])
    assert load_config(["--objective.name=grpo", "--objective.dual_clip=null"]).objective.hyper == {"dual_clip": None}
    assert load_config(["--objective.name=minpro", "--objective.include_one"]).objective.hyper == {"include_one": True}
    with pytest.raises(ConfigError, match=r"--objective.clip_eps_low: expected a value"):
        load_config(["--objective.clip_eps_low", "--objective.name=minpro"])
    # Keywords every objective accepts work with the default P3O too.
    assert load_config(["--objective.ref_kl_coef", "0.1"]).objective.hyper == {"ref_kl_coef": 0.1}


def test_dict_and_yaml_round_trip(tmp_path):
    cfg = load_config(
        ["--objective.name=grpo", "--objective.clip_eps=0.3", "--optim.betas=[0.8,0.9]", "--log.tensorboard=false"]
    )
    d = to_dict(cfg)
    assert d["objective"] == {"name": "grpo", "clip_eps": 0.3}
    assert d["optim"]["betas"] == [0.8, 0.9]
    assert from_dict(d) == cfg
    assert from_dict({"optim.lr": 0.01, "loop": {"mode": "async"}}).loop.mode == "async"  # dotted keys in dicts too

    path = save_config(cfg, tmp_path / "run" / "config.yaml")
    text = path.read_text()
    assert text.startswith("# ")
    loaded = yaml.safe_load(text)
    assert loaded["objective"]["agg"] == objective_hyper(cfg.objective)["agg"]  # resolved: defaults written out
    again = load_config(["--config", str(path)])
    assert objective_hyper(again.objective) == objective_hyper(cfg.objective)
    assert dataclasses.replace(again, objective=cfg.objective) == cfg
    # Unresolved save is an exact round trip.
    save_config(cfg, tmp_path / "plain.yaml", resolve_objective=False)
    assert load_config(["--config", str(tmp_path / "plain.yaml")]) == cfg


def test_yaml_file_errors_name_the_file(tmp_path):
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'optim.lrr' \(did you mean 'optim.lr'\?\)"):
        load_config(["--config", str(bad_key)])
    bad_value = tmp_path / "val.yaml"
    bad_value.write_text("rollout:\n  precision: fp4\n")
    with pytest.raises(ConfigError, match=r"val.yaml: rollout.precision: expected one of"):
        load_config(["--config", str(bad_value)])
    broken = tmp_path / "broken.yaml"
    broken.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: line \d+ invalid YAML"):
        load_config(["--config", str(broken)])
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"list\.yaml: expected a mapping"):
        load_config(["--config", str(not_mapping)])
    with pytest.raises(ConfigError, match="file not found"):
        load_config(["--config", str(tmp_path / "missing.yaml")])


def test_config_file_then_overrides_and_extends(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("extends: grpo\nsteps: 5\nobjective:\n  clip_eps: 0.25\n")
    cfg = load_config(["--config", str(child), "--steps", "6"])
    assert cfg.run_dir == "runs/grpo" and cfg.objective.name == "grpo"  # from the grpo preset
    assert cfg.objective.hyper["clip_eps"] == 0.25 and cfg.steps == 6  # file over preset, command line over file
    loop_a, loop_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    loop_a.write_text(f"extends: {loop_b}\n")
    loop_b.write_text(f"extends: {loop_a}\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(["--config", str(loop_a)])


def test_apply_overrides_copies_and_validates():
    cfg = TrainConfig()
    new = apply_overrides(cfg, {"loop.mode": "stale", "loop.staleness": "8", "optim": {"lr": 1e-3}})
    assert (new.loop.mode, new.loop.staleness, new.optim.lr) == ("stale", 8, 1e-3)
    assert cfg.loop.mode == TrainConfig().loop.mode == "async"  # the original is not mutated
    with pytest.raises(ConfigError, match=r"did you mean 'loop.staleness'"):
        apply_overrides(cfg, {"loop.stalenes": 2})


def test_presets_load_and_start_with_their_command():
    assert set(MY_PRESETS) <= set(list_presets())
    for name in MY_PRESETS:
        path = preset_path(name)
        assert path.read_text().splitlines()[0] == f"# p3o train --config {name}", path
        cfg = load_config(["--config", name])
        assert cfg.run_dir == f"runs/{name}"
    regenerate = "python -m p3o.config > src/p3o/configs/default.yaml"
    assert load_config(["--config", "default"]) == TrainConfig(), f"the default preset is stale: {regenerate}"
    assert preset_path("default").read_text() == default_preset_text(), f"the default preset is stale: {regenerate}"
    assert load_config(["--config", "grpo"]).objective.name == "grpo"
    assert load_config(["--config", "stale"]).loop.mode == "stale"
    assert load_config(["--config", "async"]).loop.mode == "async"
    assert load_config(["--config", "fp8-rollout"]).rollout.precision == "fp8"
    quick = load_config(["--config", "quick.yaml"])  # the .yaml suffix is optional
    assert quick.steps <= 3
    for name in list_presets():  # presets of other components (e.g. smollm2-arithmetic) are valid configs too
        path = preset_path(name)
        first = path.read_text().splitlines()[0]
        assert first.startswith("# ") and f"p3o train --config {name}" in first, path
        load_config(["--config", name])


def test_presets_resolve_from_any_cwd_and_live_only_in_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = REPO / "src" / "p3o" / "configs"
    assert preset_path("quick") == packaged / "quick.yaml"
    assert set(list_presets()) == {p.stem for p in packaged.glob("*.yaml")} >= set(MY_PRESETS)
    # one copy: the repository's configs/ holds the experiments' study files, no user preset
    assert not list((REPO / "configs").glob("*.yaml")), "presets belong in src/p3o/configs/"


def test_config_help_lists_every_key():
    text = config_help()
    for key in _leaf_keys():
        if key != "objective.hyper":
            assert f"--{key} " in text, key
    assert "--objective.<hyper>" in text and "quick" in text


def test_rollout_worker_and_lag_keys_and_their_cross_checks():
    cfg = load_config(
        ["--rollout.workers", "2", "--rollout.inflight_updates", "--loop.lag_policy", "drop", "--ray.num_cpus", "4"]
    )
    assert (cfg.rollout.workers, cfg.rollout.inflight_updates, cfg.loop.lag_policy) == (2, True, "drop")
    assert (cfg.ray.num_cpus, cfg.ray.address, cfg.loop.schedule, cfg.rollout.colocate) == (4, None, "fixed", False)
    assert load_config(["--rollout.workers", "1", "--ray.address", "auto"]).ray.address == "auto"
    for argv, message in [
        (["--rollout.workers", "-1"], "rollout.workers: must be >= 0, got -1"),
        (["--ray.num_cpus", "0"], "ray.num_cpus: must be >= 1, got 0"),
        (["--loop.lag_policy", "skip"], "loop.lag_policy: expected one of wait, drop, got 'skip'"),
        (["--loop.schedule", "loose"], "loop.schedule: expected one of fixed, free, got 'loose'"),
        (["--rollout.workers", "1", "--loop.mode", "stale"], "rollout.workers: Ray rollout workers run with"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(argv)
        assert message in str(err.value) and "\n" not in str(err.value), (argv, str(err.value))
    assert load_config(["--rollout.workers", "1", "--loop.mode", "sync"]).rollout.workers == 1


def _offpolicy_sources(cfg) -> set[str]:
    """Which off-policy sources a config's settings exercise (issue 32: a preset's header must name exactly these)."""
    found = set()
    loop = cfg.loop
    if (loop.mode == "async" and loop.max_lag > 0) or (loop.mode == "stale" and loop.staleness > 0):
        found.add("lag")
    if loop.mode == "reuse":
        found.add("lag")
    if cfg.update.num_mini_batches > 1 or cfg.update.epochs > 1:
        found.add("mini-batches")
    engine_dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[cfg.model.dtype]
    temperature_gap = cfg.rollout.logprob_mode == "processed" and cfg.rollout.temperature != cfg.train.temperature
    if cfg.rollout.precision != engine_dtype or cfg.rollout.kv_cache_dtype != "auto" or temperature_gap:
        found.add("engine")
    return found


@pytest.mark.parametrize("name", list_presets())
def test_each_preset_header_names_the_offpolicy_source_its_settings_exercise(name):
    header = [ln for ln in preset_path(name).read_text().splitlines() if ln.startswith("# Off-policy source:")]
    assert len(header) == 1, f"configs/{name}.yaml: one '# Off-policy source: ...' header line"
    declared_text = header[0].removeprefix("# Off-policy source:").split("(")[0]
    declared = {w.strip() for w in declared_text.replace("+", ",").split(",")} - {"", "none"}
    declared = {w.split()[0] for w in declared}  # "engine alone" -> "engine"
    assert declared == _offpolicy_sources(load_config(["--config", name])), header[0]
