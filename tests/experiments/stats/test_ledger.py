"""One seed ledger across studies and recorded amendments, enforced by `p3o compare`: a confirmatory seed another
study used with an overlapping comparison is refused (one line naming that study) unless recorded as a look; a
study file changed after its confirmatory results needs a recorded amendment chain, else exit 2 with one line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from p3o.cli import main as p3o_main
from p3o.experiments.stats.ledger import amendment_chain, ledger, load_records, studies_root

FAKE = " ".join([sys.executable, str(Path(__file__).parents[1] / "fake_train.py")])
ROOT = Path(__file__).resolve().parents[3]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _study(name: str, seeds: list[int], out: Path, objectives: tuple[str, str] = ("better", "p3o")) -> dict:
    return {
        "name": name,
        "base": {"steps": 6},
        "objectives": ["p3o", {"label": "better", "overrides": {"objective.name": "grpo", "fake.bonus": 0.05}}],
        "regimes": ["on-policy"],
        "seeds": seeds,
        "out_dir": str(out / name),
        "eval": {"n_samples": 0},
        "primary": {"metric": "final_reward", "margin": 0.01},
        "claims": [
            {"id": "x", "title": "t", "kind": "better", "regimes": ["on-policy"], "objectives": list(objectives)}
        ],
    }


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "configs" / "experiments" / "records").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    return repo


_LAST_COMMIT_S = [0]


def _commit(repo: Path, name: str, raw: dict | str) -> Path:
    """Commit a study file; git's commit times have whole seconds, so each commit waits for a later second than
    the one before (two commits within one second would look simultaneous to the ledger's time checks)."""
    while int(time.time()) <= _LAST_COMMIT_S[0]:
        time.sleep(0.05)
    path = repo / "configs" / "experiments" / f"{name}.yaml"
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"declare {name}")
    _LAST_COMMIT_S[0] = int(time.time())
    return path


def _compare(path: Path, *extra: str) -> int:
    report = path.parents[2] / "docs" / "results" / f"{path.stem}.md"
    return p3o_main(["compare", str(path), "--train-cmd", FAKE, "--report", str(report), *extra])


def test_the_ledger_refuses_a_seed_reused_across_two_study_names(tmp_path: Path, capsys) -> None:
    repo = _repo(tmp_path)
    first = _commit(repo, "first", _study("first", [0, 1, 2], tmp_path))
    second = _commit(repo, "second", _study("second", [2, 3, 4], tmp_path))
    assert _compare(second, "--dry-run") == 0  # a dry run trains nothing and checks nothing
    assert _compare(second) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "seeds [2] were used by study 'first' (configs/experiments/first.yaml) comparing better, p3o" in err
    assert not (tmp_path / "second").exists()  # refused before any run or ledger line
    # The same seeds with no compared objective in common: not an overlapping comparison.
    solo = _study("third", [0, 1, 2], tmp_path)
    solo["objectives"] = [{"label": "solo", "overrides": {"objective.name": "p3o"}}]
    solo["claims"] = [{"id": "c", "title": "t", "kind": "collapse", "regimes": ["on-policy"], "objectives": ["solo"]}]
    assert _compare(_commit(repo, "third", solo)) == 0
    # A recorded look at `second` makes first's use of seed 2 legitimate for second, not the other way round.
    records = {"looks": [{"study": "second", "look": "first", "seeds": [2], "date": "d", "what": "w", "why": "y"}]}
    _commit(repo, "records/ledger", yaml.safe_dump(records))
    assert _compare(second) == 0
    assert _compare(first) == 2
    assert "seeds [2] were used by study 'second'" in capsys.readouterr().err


def test_a_changed_study_file_without_an_amendment_exits_2(tmp_path: Path, capsys) -> None:
    repo = _repo(tmp_path)
    raw = yaml.safe_dump(_study("st", [5, 6], tmp_path), sort_keys=False)
    path = _commit(repo, "st", "# p3o compare configs/experiments/st.yaml\n" + raw)
    assert _compare(path) == 0
    verdicts = repo / "docs" / "results" / "st.verdicts.json"
    first = json.loads(verdicts.read_text())["preregistration"]
    before = first["sha256"]
    # Same claims, metric, margins and seeds (the out_dir's decision rule is unchanged), but other bytes.
    _commit(repo, "st", "# p3o compare configs/experiments/st.yaml --report docs/results/st.md\n" + raw)
    assert _compare(path, "--report-only") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "st.yaml changed after its results" in err, err
    assert f"records sha256 {before[:12]}" in err and "configs/experiments/records/ledger.yaml" in err
    after = hashlib.sha256(path.read_bytes()).hexdigest()
    amendment = {
        "study": "st",
        "from": before,
        "to": after,
        "date": "2026-12-01",
        "commit": "abc",
        "what": "the command line",
        "why": "the report moved",
    }
    _commit(repo, "records/ledger", yaml.safe_dump({"amendments": [amendment]}))
    assert _compare(path, "--report-only") == 0
    pre = json.loads(verdicts.read_text())["preregistration"]
    assert pre["sha256"] == after and pre["amendments"] == [amendment]
    # its runs were declared under the first version: p3o compare --check compares them with that commit time
    assert pre["registered_at"] == first["committed_at"] and pre["committed_at"] > first["committed_at"]
    assert (
        "- Amendment (2026-12-01, commit `abc`): the command line — the report moved"
        in (repo / "docs" / "results" / "st.md").read_text()
    )
    # Writing the report again keeps the whole chain (it starts from the first amendment's `from`), byte for byte.
    text = verdicts.read_text()
    assert _compare(path, "--report-only") == 0
    assert verdicts.read_text() == text


def test_amendment_chains_follow_from_to() -> None:
    recs = load_records(Path("/nonexistent"))
    recs.amendments = [{"study": "s", "from": "a", "to": "b"}, {"study": "s", "from": "b", "to": "c"}]
    assert [a["to"] for a in amendment_chain(recs, "s", "a", "c") or []] == ["b", "c"]
    assert amendment_chain(recs, "s", "a", "a") == []
    assert amendment_chain(recs, "s", "a", "d") is None and amendment_chain(recs, "t", "a", "b") is None


def test_the_shipped_studies_pass_their_own_ledger_and_amendments() -> None:
    """Every study file of this repository: its seeds are fresh against every other study (recorded looks aside) or
    it predates pre-registration, and a confirmatory one's file is its results' file or amended to it."""
    from p3o.experiments.stats.ledger import check_amendments, check_seeds, results_of

    root = studies_root(ROOT / "configs" / "experiments" / "lag.yaml")
    uses = {u.study: u for u in ledger(root)}
    assert {"lag", "stale", "vllm-earlier-run", "synthetic-exploratory"} <= set(uses)
    for name in ("lag", "lag-grid", "stale", "stale32-k3is", "vllm", "synthetic", "synthetic-new"):
        path = ROOT / "configs" / "experiments" / f"{name}.yaml"
        check_seeds(path, name, sorted(uses[name].seeds))
        chain = check_amendments(path, name, hashlib.sha256(path.read_bytes()).hexdigest(), results_of(path, name))
        assert chain, name  # every one was path-fixed after its results (docs/results/), lag twice
    assert (
        len(
            check_amendments(
                root / "lag.yaml",
                "lag",
                hashlib.sha256((root / "lag.yaml").read_bytes()).hexdigest(),
                results_of(root / "lag.yaml", "lag"),
            )
        )
        == 2
    )
    looks = load_records(root).looks
    assert [(k["study"], k["look"], k["seeds"]) for k in looks] == [("stale", "stale-variants", [300, 301])]
