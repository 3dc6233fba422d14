"""Experiment files: a grid of objectives × regimes × seeds, parsed from YAML and expanded into runs.

    # configs/experiments/lm.yaml
    name: quick
    base: {steps: 40, model.name: tiny}          # overrides shared by every run (nested maps are flattened)
    objectives: [p3o, grpo-0.2, {label: grpo-wide, overrides: {objective.name: grpo, objective.clip_eps: 0.6}}]
    regimes: [on-policy, {preset: stale-4, objectives: [p3o]}]   # names from p3o.experiments.grid.regimes or
                                                 # {label, overrides, preset, objectives (subset run there)}
    seeds: [0, 1, 2]                             # or a count: 3
    out_dir: runs/compare/quick
    eval: {n_samples: 4, n_problems: 256}        # final evaluation of the base and every run, on one engine
                                                 # (`engine: hf` by default, whatever engine a run trained with)

    exp = load_experiment("configs/experiments/lm.yaml"); runs = expand(exp)

A run's overrides are merged base < regime < objective < {seed, run_dir}; its directory is
`out_dir/runs/<regime>/<objective>/seed<k>`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from p3o.config import TrainConfig, apply_overrides, from_dict
from p3o.config import config_field as _f
from p3o.errors import ConfigError
from p3o.experiments.grid.peak import check_peak_study
from p3o.experiments.grid.regimes import OBJECTIVE_PRESETS, REGIMES, Overrides

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_TOP_KEYS = {
    "name",
    "description",
    "base",
    "objectives",
    "regimes",
    "seeds",
    "out_dir",
    "eval",
    "analysis",
    "claims",
    "primary",
    "calibration",
    "baselines",
}
#: Decisive kinds (paired by seed, Holm-corrected, verdict supported / contradicted / inconclusive) and
#: descriptive kinds (a table and a sentence, no verdict).
DECISIVE_KINDS = ("better", "worse", "tracks", "identical")
CLAIM_KINDS = (*DECISIVE_KINDS, "spread", "collapse", "rank")


@dataclass
class Arm:
    """One objective or one regime of the grid: a label (directory name, legend) and its dotted overrides."""

    label: str
    overrides: Overrides
    objectives: list[str] | None = None
    """Regimes only: the objective labels run in this regime (None = all of the experiment's objectives)."""


@dataclass
class EvalSpec:
    """Final-policy evaluation of every run (pass@k on the task's test split); n_samples = 0 turns it off."""

    n_samples: int = _f(4, "samples per test problem (0: no final evaluation)", ge=0)
    n_problems: int = _f(64, "test problems (the first n of the split)", ge=1)
    split: str = _f("test", "task split to evaluate on")
    temperature: float = _f(1.0, "sampling temperature of the evaluation", gt=0)
    max_new_tokens: int | None = _f(None, "generation budget (None: the run's rollout.max_new_tokens)", ge=1)
    engine: Literal["hf", "vllm"] = _f(
        "hf",
        "engine of every evaluation, the base's and each run's, whatever engine the run trained with (one engine "
        "for every arm, so their pass@1 compare)",
    )


@dataclass
class AnalysisSpec:
    """How curves are smoothed and what counts as a collapse."""

    smooth: int = _f(5, "trailing moving-average window (steps) for curves and collapse detection", ge=1)
    collapse_drop: float = _f(
        0.3, "a collapse is a fall of more than this fraction below the smoothed peak reward, to the end", gt=0, lt=1
    )
    min_peak: float = _f(0.05, "peaks below this reward are too small to call a fall from them a collapse", ge=0)
    noise_z: float = _f(3.0, "a collapse must also exceed this many standard errors of the batch noise", ge=0)
    final_frac: float = _f(0.2, "'final' reward = mean over this last fraction of the steps", gt=0, le=1)


@dataclass
class PrimarySpec:
    """The pre-registered decision rule of an experiment, declared in the file before any run.

    Every decisive claim compares two objectives *paired by seed* on `metric` (unless the claim names another),
    with a (1 − alpha) paired-t interval, Holm's correction across all decisive claims of the report, and
    `margin` as the equivalence margin of `tracks` claims (TOST).
    """

    metric: str = _f(
        "final_reward",
        "per-run number the verdicts use: final_reward, pass@1, late_eval, or any per-run summary key (ess, ...)",
    )
    alpha: float = _f(0.05, "family-wise error rate of the report's verdicts", gt=0, lt=1)
    margin: float = _f(0.03, "equivalence margin δ (absolute, in the metric's units) of `tracks` claims", gt=0)
    secondary: list[str] = field(
        default_factory=list, metadata={"help": "metrics reported beside the primary one (no verdicts)"}
    )


@dataclass
class Claim:
    """A claim from the papers, tested on the grid and rendered with its own table and verdict in the report.

    Decisive kinds compare objectives[0] (A) with objectives[1] (B), paired by seed, in every listed regime:
    `better` (A > B), `worse` (A < B), `tracks` (|A − B| < margin, TOST) and `identical` (every paired difference
    exactly 0). Descriptive kinds: `spread` (range of the metric across `objectives`, compared with `reference`),
    `collapse` (collapses per objective), `rank` (order of objectives; are the `expected` ones on top?).
    `metric` and `margin` default to the experiment's `primary` block.
    """

    id: str
    title: str
    kind: str
    regimes: list[str]
    objectives: list[str]
    metric: str = ""
    reference: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    text: str = ""
    margin: float | None = None


@dataclass
class BaselineFamily:
    """A declared family of baselines: a claim whose B is the family's name compares A with its members.

    ``rule: each`` tests A against every member (each comparison a verdict of the Holm family); ``rule: best``
    tests A against the member with the highest mean of the claim's metric on ``selection_seeds`` in that regime
    (seeds disjoint from the experiment's test seeds; the grid runs the members on them too):

        baselines:
          grpo-family: {members: [grpo-tm-0.2, grpo-tm-0.4, grpo-tm-0.6, grpo-minpro, grpo-tis, cispo-1-4,
                                  minpro-1-4], rule: best, selection_seeds: [100, 101, 102]}
        claims: [{id: x, title: P3O beats the best GRPO-family baseline, kind: better, regimes: [stale-2],
                  objectives: [p3o, grpo-family]}]
    """

    name: str
    members: list[str]
    rule: str = "each"
    selection_seeds: list[int] = field(default_factory=list)


@dataclass
class Experiment:
    """A parsed experiment file (see the module docstring)."""

    name: str
    objectives: list[Arm]
    regimes: list[Arm]
    seeds: list[int]
    out_dir: Path
    base: Overrides = field(default_factory=dict)
    description: str = ""
    eval: EvalSpec = field(default_factory=EvalSpec)
    analysis: AnalysisSpec = field(default_factory=AnalysisSpec)
    claims: list[Claim] = field(default_factory=list)
    primary: PrimarySpec = field(default_factory=PrimarySpec)
    calibration: str | None = None
    """Objective label whose runs make the report's calibration table (how off-policy each regime is)."""
    baselines: dict[str, BaselineFamily] = field(default_factory=dict)
    source: Path | None = None

    def decision_rule(self) -> dict[str, Any]:
        """What the verdicts depend on (pre-registration digest): the primary block, the claims, the families."""
        return {"primary": self.primary, "claims": self.claims, "baselines": self.baselines}

    def selection_runs(self) -> list[tuple[str, str, int]]:
        """(regime, objective, seed) of the selection runs of ``rule: best`` families, in the regimes of the claims
        that name them."""
        out: list[tuple[str, str, int]] = []
        for claim in self.claims:
            family = self.baselines.get(claim.objectives[1]) if len(claim.objectives) == 2 else None
            if family is None or family.rule != "best":
                continue
            for regime in claim.regimes:
                out += [(regime, m, s) for m in family.members for s in family.selection_seeds]
        return list(dict.fromkeys(out))

    def objectives_in(self, regime: str) -> list[str]:
        """Labels of the objectives run in `regime`, in the experiment's objective order."""
        arm = next(a for a in self.regimes if a.label == regime)
        return [o.label for o in self.objectives if arm.objectives is None or o.label in arm.objectives]


@dataclass
class RunSpec:
    """One training run of the grid."""

    regime: str
    objective: str
    seed: int
    run_dir: Path
    overrides: Overrides

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.regime, self.objective, self.seed)


def flatten(tree: dict[str, Any], prefix: str = "") -> Overrides:
    """Nested maps to dotted keys: {"rollout": {"group_size": 8}} -> {"rollout.group_size": 8}."""
    out: Overrides = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _arm(entry: Any, presets: dict[str, Overrides], where: str, subset: bool = False) -> Arm:
    if isinstance(entry, str):
        if entry not in presets:
            near = difflib.get_close_matches(entry, presets, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ConfigError(f"{where}: unknown preset '{entry}'{hint}; known: {', '.join(presets)}")
        return Arm(entry, dict(presets[entry]))
    if isinstance(entry, dict):
        allowed = {"label", "overrides", "preset"} | ({"objectives"} if subset else set())
        unknown = set(entry) - allowed
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; expected {', '.join(sorted(allowed))}")
        overrides: Overrides = {}
        if "preset" in entry:
            overrides.update(_arm(str(entry["preset"]), presets, where).overrides)
        raw = entry.get("overrides") or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}.overrides: expected a mapping of config keys, got {type(raw).__name__}")
        overrides.update(flatten(raw))
        label = entry.get("label", entry.get("preset"))
        if label is None:
            raise ConfigError(f"{where}: needs a 'label' (or a 'preset' to take it from)")
        only = entry.get("objectives")
        if only is not None and (not isinstance(only, list) or not only or not all(isinstance(o, str) for o in only)):
            raise ConfigError(f"{where}.objectives: expected a non-empty list of objective labels")
        return Arm(str(label), overrides, only)
    raise ConfigError(f"{where}: expected a preset name or {{label, overrides}}, got {entry!r}")


def _arms(raw: Any, presets: dict[str, Overrides], where: str, subset: bool = False) -> list[Arm]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list")
    arms = [_arm(e, presets, f"{where}[{i}]", subset) for i, e in enumerate(raw)]
    labels = [a.label for a in arms]
    for i, label in enumerate(labels):
        if not _LABEL.match(label):
            raise ConfigError(f"{where}[{i}].label: '{label}' must be a plain name (letters, digits, . _ + -)")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"{where}: duplicate label(s) {dupes}")
    return arms


def _dataclass_from(cls: type, raw: Any, where: str) -> Any:
    """A section of the file as ``cls``: the project's one config mechanism (types, bounds, nearest-name errors)."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    return from_dict(raw, cls=cls, source=where)


def claim_from(raw: dict, where: str) -> Claim:
    """A claim entry, its fields typed (pydantic validates the dataclass); unknown keys name the nearest one."""
    names = list(Claim.__dataclass_fields__)
    for key in raw:
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}; known: {', '.join(names)}")
    raw = {**raw, "regimes": [raw["regimes"]] if isinstance(raw.get("regimes"), str) else raw.get("regimes")}
    try:
        return pydantic.TypeAdapter(Claim).validate_python(raw)
    except pydantic.ValidationError as err:
        e = err.errors()[0]
        field_name = ".".join(str(p) for p in e["loc"])
        raise ConfigError(f"{where}.{field_name}: {e['msg'].lower()}, got {e.get('input')!r}") from None


def parse_experiment(raw: Any, source: Path | None = None, *, check_config: bool = False) -> Experiment:
    """Validate a loaded experiment mapping; errors name the file and field.

    ``check_config``: also check `base` and every regime × objective merge against p3o's train config (what
    ``load_experiment`` does for ``p3o compare``; off for grids run by another trainer via ``--train-cmd``).
    """
    where = str(source) if source else "experiment"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(_TOP_KEYS))}")
    for key in ("name", "objectives", "regimes"):
        if key not in raw:
            raise ConfigError(f"{where}: missing required key '{key}'")
    name = str(raw["name"])
    if not _LABEL.match(name):
        raise ConfigError(f"{where}: name '{name}' must be a plain name (letters, digits, . _ + -)")
    seeds_raw = raw.get("seeds", [0])
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds = list(range(seeds_raw))
    elif isinstance(seeds_raw, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw):
        seeds = list(seeds_raw)
    else:
        raise ConfigError(f"{where}: seeds: expected a list of integers or a count, got {seeds_raw!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: seeds: expected distinct seeds, got {seeds_raw!r}")
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{where}: base: expected a mapping of config overrides")
    exp = Experiment(
        name=name,
        objectives=_arms(raw["objectives"], OBJECTIVE_PRESETS, f"{where}: objectives"),
        regimes=_arms(raw["regimes"], REGIMES, f"{where}: regimes", subset=True),
        seeds=seeds,
        out_dir=Path(str(raw.get("out_dir", f"runs/compare/{name}"))),
        base=flatten(base),
        description=str(raw.get("description", "") or ""),
        eval=_dataclass_from(EvalSpec, raw.get("eval"), f"{where}: eval"),
        analysis=_dataclass_from(AnalysisSpec, raw.get("analysis"), f"{where}: analysis"),
        primary=_dataclass_from(PrimarySpec, raw.get("primary"), f"{where}: primary"),
        source=source,
    )
    cal = raw.get("calibration")
    if cal is not None:
        if (
            not isinstance(cal, dict)
            or set(cal) != {"objective"}
            or cal["objective"] not in {a.label for a in exp.objectives}
        ):
            raise ConfigError(f"{where}: calibration: expected {{objective: <one of the objectives>}}")
        exp.calibration = str(cal["objective"])
    labels = {a.label for a in exp.objectives}
    for i, arm in enumerate(exp.regimes):
        for label in arm.objectives or []:
            if label not in labels:
                raise ConfigError(f"{where}: regimes[{i}].objectives: '{label}' is not one of the objectives")
    exp.baselines = _families(raw.get("baselines"), exp, where)
    exp.claims = _claims(raw.get("claims") or [], exp, where)
    metrics = [exp.primary.metric, *exp.primary.secondary, *(c.metric for c in exp.claims)]
    try:  # an unbiased peak needs every evaluated step's checkpoint (p3o.experiments.grid.peak)
        check_peak_study(exp.base, metrics)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    if check_config:
        _validate_overrides(exp, where)
    return exp


def _validate_overrides(exp: Experiment, where: str) -> None:
    """Check `base` and every regime × objective merge against the train config now, not N subprocesses later.

    The error names the file and the arm, and keeps the config's own message (with its nearest-name hint).
    """
    try:
        apply_overrides(TrainConfig(), exp.base)
    except ConfigError as err:
        raise ConfigError(f"{where}: base: {err}") from None
    for regime in exp.regimes:
        for objective in exp.objectives:
            if regime.objectives is not None and objective.label not in regime.objectives:
                continue
            try:
                apply_overrides(TrainConfig(), {**exp.base, **regime.overrides, **objective.overrides})
            except ConfigError as err:
                raise ConfigError(f"{where}: regime '{regime.label}' × objective '{objective.label}': {err}") from None


def _families(raw: Any, exp: Experiment, where: str) -> dict[str, BaselineFamily]:
    """The ``baselines:`` block: {name: {members, rule, selection_seeds}}, members among the objectives."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: baselines: expected a mapping of family name -> {{members, rule, ...}}")
    labels = {a.label for a in exp.objectives}
    out = {}
    for name, entry in raw.items():
        here = f"{where}: baselines.{name}"
        if name in labels or not _LABEL.match(str(name)):
            raise ConfigError(f"{here}: a family needs a plain name that is not an objective label")
        if not isinstance(entry, dict) or set(entry) - {"members", "rule", "selection_seeds"}:
            raise ConfigError(f"{here}: expected {{members, rule, selection_seeds}}")
        members = entry.get("members")
        if not isinstance(members, list) or not members or any(m not in labels for m in members):
            raise ConfigError(f"{here}.members: expected a non-empty list of the experiment's objective labels")
        rule = str(entry.get("rule", "each"))
        sel = entry.get("selection_seeds") or []
        if rule not in ("each", "best"):
            raise ConfigError(f"{here}.rule: '{rule}' is not one of each, best")
        if not isinstance(sel, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in sel):
            raise ConfigError(f"{here}.selection_seeds: expected a list of integers")
        if rule == "best" and not sel:
            raise ConfigError(f"{here}: rule 'best' picks on selection_seeds, disjoint from the test seeds")
        shared = sorted(set(sel) & set(exp.seeds))
        if shared:
            raise ConfigError(f"{here}.selection_seeds: {shared} are also test seeds; they must be disjoint")
        out[str(name)] = BaselineFamily(str(name), [str(m) for m in members], rule, [int(x) for x in sel])
    return out


def _claims(raw: Any, exp: Experiment, where: str) -> list[Claim]:
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: claims: expected a list")
    objectives = {a.label for a in exp.objectives}
    regimes = {a.label for a in exp.regimes}
    out = []
    for i, entry in enumerate(raw):
        here = f"{where}: claims[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{here}: expected a mapping")
        claim = claim_from(entry, here)
        if claim.kind not in CLAIM_KINDS:
            raise ConfigError(f"{here}.kind: '{claim.kind}' is not one of {', '.join(CLAIM_KINDS)}")
        family = exp.baselines.get(claim.objectives[1]) if len(claim.objectives) == 2 else None
        compared = [claim.objectives[0], *family.members] if family else claim.objectives
        if family is not None and claim.kind not in DECISIVE_KINDS:
            raise ConfigError(
                f"{here}: a baseline family is compared by a decisive claim ({', '.join(DECISIVE_KINDS)})"
            )
        for label in [*compared, *claim.reference, *claim.expected]:
            if label not in objectives:
                raise ConfigError(f"{here}: objective '{label}' is not in this experiment's objectives")
        for label in claim.regimes:
            if label not in regimes:
                raise ConfigError(f"{here}: regime '{label}' is not in this experiment's regimes")
            ran = set(exp.objectives_in(label))
            absent = [o for o in [*compared, *claim.reference] if o not in ran]
            if absent:
                raise ConfigError(f"{here}: objective(s) {absent} are not run in regime '{label}'")
        if claim.kind in DECISIVE_KINDS and len(claim.objectives) != 2:
            raise ConfigError(f"{here}: a '{claim.kind}' claim compares exactly two objectives (A, B)")
        if claim.margin is not None and not claim.margin > 0:
            raise ConfigError(f"{here}.margin: must be > 0, got {claim.margin}")
        claim.metric = claim.metric or exp.primary.metric
        out.append(claim)
    return out


def load_experiment(path: str | Path, *, check_config: bool = True) -> Experiment:
    """Read and validate an experiment YAML file (ConfigError naming the file and field on bad input); with
    ``check_config`` every run's overrides are checked against the train config at parse time."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    return parse_experiment(raw, source=path, check_config=check_config)


def expand(exp: Experiment) -> list[RunSpec]:
    """Every (regime, objective, seed) run, regime-major, with merged overrides (base < regime < objective); then
    the selection runs of ``rule: best`` baseline families (:meth:`Experiment.selection_runs`)."""
    regimes = {a.label: a for a in exp.regimes}
    objectives = {a.label: a for a in exp.objectives}
    keys = [
        (regime.label, objective.label, seed)
        for regime in exp.regimes
        for objective in exp.objectives
        if regime.objectives is None or objective.label in regime.objectives
        for seed in exp.seeds
    ]
    runs = []
    for regime, objective, seed in list(dict.fromkeys([*keys, *exp.selection_runs()])):
        run_dir = exp.out_dir / "runs" / regime / objective / f"seed{seed}"
        overrides = {**exp.base, **regimes[regime].overrides, **objectives[objective].overrides, "seed": seed}
        overrides["run_dir"] = str(run_dir)
        runs.append(RunSpec(regime, objective, seed, run_dir, overrides))
    return runs
