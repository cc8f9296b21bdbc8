"""The replication report (benchmarks/replication/report.py and the parts it renders): the committed Results section
is what the committed run JSON gives, and each part of the study shows its runs, tables and verdict scopes."""

from __future__ import annotations

import json

from _replication_helpers import BB, KMEANS, as_part, fake_run, fake_study, write_runs

from benchmarks.replication import formatting, judging, report
from benchmarks.replication.readme import README_METRICS


def test_missing_groups_are_not_testable(tmp_path):
    text, files, summary, readme = report.render(tmp_path / "results", tmp_path)
    assert files == {}  # no group ran: no all-metrics table
    assert "**Replication study**: nothing has run yet" in readme
    assert "### CPU group: one epoch, each method's defaults\n\nScope: " in text and "\n\nNot run yet." in text
    verdicts = {r["claim"]: r["verdict"] for r in summary["verdicts"]}
    assert set(verdicts.values()) == {"not testable here"}
    # The claims about Hypersolid's own settings show their evidence and the batch arms' runs, none yet.
    own = text.split("Evidence, Hypersolid's own settings", 1)[1].split("\n### ", 1)[0]
    assert "| Batch 128 is the best global batch (equal steps) | **not testable" in own
    assert own.count("| not run yet |") == 6


def test_report_writes_and_checks_a_section(tmp_path):
    results = tmp_path / "results"
    (results / "cpu").mkdir(parents=True)
    for r in fake_study({"simclr": -0.05, "swav": -0.05, "barlowtwins": -0.05}, seeds=3):
        (results / "cpu" / f"{r['run']}.json").write_text(json.dumps(r))
    doc = tmp_path / "replication.md"
    doc.write_text("# Study\n\nprotocol text\n\n## Results\n\nstale section\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Tool\n\n{report.README_START}stale summary\n{report.README_END}\nafter\n")
    args = ["--results", str(results), "--doc", str(doc), "--readme", str(readme)]
    assert report.main(args) == 0
    text = doc.read_text()
    assert text.startswith("# Study\n\nprotocol text\n\n## Results\n") and "stale section" not in text
    assert "| Hypersolid clusters better: K-Means |" in text and "**holds here**" in text
    summary = readme.read_text()
    assert "stale summary" not in summary and summary.endswith(f"{report.README_END}\nafter\n")
    # The README block: the scope in one line, one table at the longest budget run (here 1 epoch; no random-init
    # runs: "–"), what holds, what does not, what cannot be judged; at most 15 lines.
    block = summary.split(report.README_START)[1].split(report.README_END)[0]
    assert len(block.splitlines()) <= 15
    held = next(line for line in block.splitlines() if line.startswith("* **Holds**"))
    assert "Hypersolid clusters better: K-Means" in held
    header = next(line for line in block.splitlines() if line.startswith("| 1 epoch, defaults: mean"))
    assert "| K-Means AMI |" in header and "| Hypersolid | " in block
    floor = next(line for line in block.splitlines() if line.startswith("| random init |"))
    assert floor.count("| – ") == len(README_METRICS)
    assert "\n**Replication study, at its scope**: Fashion-MNIST (10 classes)" in summary
    # The claims about Hypersolid's own settings are on a line of their own, each with its own budget (not the
    # table's): none of them is said to be judged "here".
    cannot = next(line for line in block.splitlines() if line.startswith("* **Cannot be judged here**"))
    own = next(line for line in block.splitlines() if line.startswith("* **Hypersolid's own settings**"))
    assert "Batch 128" not in cannot and "L2" not in cannot
    assert "Batch 128 is the best global batch (equal steps) — not testable at equal steps: 64 × 1 epoch" in own
    assert "The weak L2 term lowers anisotropy and raises sparsity — not testable after 20 epochs" in own
    familywise = next(line for line in block.splitlines() if line.startswith("* **Family-wise**"))
    assert "K-Means" in familywise.split("holds:")[1]  # 0.05 below on 3 seeds survives the correction
    assert "SimCLR (best by kNN@5 of the baselines run here: SimCLR, SwAV, Barlow Twins)" in block
    assert (results / "report" / "cpu_headline.png").stat().st_size > 10_000
    table = (results / "report" / "cpu_all_metrics.md").read_text()
    assert "| backbone.raw.kmeans.ami | kmeans |" in table
    assert "| backbone.raw.geometry.sparsity | geometry |" in table
    assert report.main([*args, "--check"]) == 0
    # A changed result makes the committed section stale.
    p = results / "cpu" / "cpu-simclr-s0.json"
    r = json.loads(p.read_text())
    r["final"][f"{BB}linear_top1"] += 1.0
    p.write_text(json.dumps(r))
    assert report.main([*args, "--check"]) == 1


def test_committed_report_matches_committed_results():
    assert report.main(["--check"]) == 0, "run: python -m benchmarks.replication.report"


def test_step_evaluations_stay_out_of_the_comparison(tmp_path):
    results = tmp_path / "results"
    (results / "cpu").mkdir(parents=True)
    runs = fake_study({}, seeds=2)
    steps = fake_run("hypersolid", 0, {f"{BB}kmeans.ami": 0.9})
    steps.update(run="cpu-hypersolid-s0-steps", part="steps")
    steps["per_epoch"] = [
        {"epoch": round(s / 468, 3), "step": s, f"{BB}kmeans.ami": 0.1 * i, "protocol.exclusion.same_class_frac": 0.5}
        for i, s in enumerate((100, 200, 468), 1)
    ]
    for r in [*runs, steps]:
        (results / "cpu" / f"{r['run']}.json").write_text(json.dumps(r))
    text, _files, _summary, _readme = report.render(results, tmp_path)
    assert "| 200 | 0.427 | – | – | 0.200 | – | – | 0.500 | – |" in text
    # Its last evaluation against the plain seed-0 run: only K-Means AMI (0.3 vs ~0.5) was given, and differs.
    n = sum(1 for k in runs[0]["final"] if k.startswith("protocol."))
    assert f"equals cpu-hypersolid-s0's (the same seed, trained and evaluated separately) on 0 of {n} metrics" in text
    # Seed 0's K-Means AMI in the comparison is the plain run's (~0.5), not the step run's 0.9.
    plain = [r["final"][f"{BB}kmeans.ami"] for r in runs if r["method"] == "hypersolid"]
    kmeans_row = next(line for line in text.splitlines() if line.startswith("| K-Means AMI | "))
    assert kmeans_row.split("|")[2].strip().startswith(formatting.fmt(sum(plain) / 2) + " [")


def test_random_init_tuning_views_and_budget_in_the_report(tmp_path):
    from benchmarks.replication import plan

    results = tmp_path / "results"
    study = fake_study({}, seeds=2)
    hyp = [r for r in study if r["method"] == "hypersolid"]
    simclr = [r for r in study if r["method"] == "simclr"]
    extra = []
    for r in hyp:  # the floor: K-Means AMI 0.1 (trained: ~0.5)
        floor = {**r["final"], f"{BB}kmeans.ami": 0.1}
        extra.append(as_part({**r, "final": floor}, f"cpu-random-s{r['seed']}", "random"))
        extra.append(as_part(r, f"cpu-hypersolid2v-s{r['seed']}", "views", ("data.num_local_views=0",)))
    # Tuning: every value of both methods, both seeds; alpha 0.75 and temperature 0.5 best on held-out kNN@5.
    best = {"method.hypersolid.alpha=0.75", "method.simclr.temperature=0.5"}
    for run in plan.tune_runs():
        src = (hyp if run.method == "hypersolid" else simclr)[run.seed]
        final = {**src["final"], plan.TUNE_METRIC: 90.5 if run.overrides[0] in best else 80.5}
        extra.append(as_part({**src, "final": final}, run.name, "tune", run.overrides))
    # 5 epochs: alpha 0.9 at seeds 0-1, evaluated after epochs 1, 2, 5; nothing else yet.
    for r in hyp:
        per_epoch = [{**r["final"], "epoch": e, f"{BB}kmeans.ami": 0.1 * e} for e in (1, 2, 5)]
        name = f"cpu-budget-hypersolid-alpha0.9-s{r['seed']}"
        extra.append(
            as_part(
                r, name, "budget", ("method.hypersolid.alpha=0.9",), epochs=5, per_epoch=per_epoch, final=per_epoch[-1]
            )
        )
    write_runs(results, [*study, *extra])
    text, _files, summary, readme = report.render(results, tmp_path)
    assert summary["tuned"] == {"hypersolid": 0.75, "simclr": 0.5}
    # The floor is a column of the CPU tables, never a compared method.
    kmeans_row = next(line for line in text.splitlines() if line.startswith("| K-Means AMI | "))
    assert kmeans_row.rstrip(" |").endswith("0.100 [0.100, 0.100] (n = 2)")
    assert "| random init |" in readme and summary["runs"]["random"] == 2
    row = next(line for line in text.splitlines() if line.startswith("| random init (the initial weights) | 0 | "))
    assert row.split(" | ")[4] == "0.100 [0.100, 0.100] (n = 2)"  # the learning curves' K-Means column
    hdbscan = next(line for line in text.splitlines() if line.startswith("| 10 | "))
    assert hdbscan.count(" / ") == 4 * 5 and "not run" not in hdbscan  # 4 methods and the floor
    # Tuning table: 2 of 2 seeds per value, the chosen value marked.
    assert "| Hypersolid | alpha 0.75 | 2 of 2 | 90.50 [90.50, 90.50] (n = 2) |" in text
    assert text.count("**chosen**") == 2
    # The 5-epoch part: alpha 0.9 has 2 of 5 seeds, alpha 0.75 and SimCLR 0.5 are planned and not run.
    assert "* Hypersolid α 0.9 (the paper's): 2 of 5 seeds done." in text
    assert "* Hypersolid α 0.75 (tuned): 0 of 5 seeds done." in text
    assert "* SimCLR temperature 0.5 (tuned): 0 of 5 seeds done." in text
    curve = [line for line in text.splitlines() if line.startswith("| Hypersolid α 0.9 (the paper's) | ")]
    assert [line.split(" | ")[1] for line in curve] == ["1", "2", "5"]
    assert [line.split(" | ")[4] for line in curve] == [f"{v} [{v}, {v}] (n = 2)" for v in ("0.100", "0.200", "0.500")]
    assert curve[0].endswith("| – |")  # a metric the runs lack: "–", not "not run"
    assert "| SimCLR temperature 0.5 (tuned) | 1 | not run |" in text
    # The planned-but-not-run table counts what a rerun of cpu.sh does next.
    assert "| budget | 15 | 2 | 13 |" in text and "| tune | 18 | 18 | 0 |" in text
    # 2-view Hypersolid: its own scope against the baselines, judged.
    views = [r for r in summary["verdicts"] if r["short"] == "1 epoch, defaults, Hypersolid 2 views"]
    assert views and all(r["verdict"] != "not testable here" or r["evidence"] for r in views)
    assert any(r["verdict"] in {"inconclusive here", "holds here", "does not hold here"} for r in views)
    five = [r for r in summary["verdicts"] if r["short"].startswith("5 epochs")]
    assert {r["verdict"] for r in five} == {"not testable here"}
    # no SimCLR 5-epoch run yet


def test_the_20_epoch_part_has_its_curves_loss_terms_and_verdicts_at_5_and_20(tmp_path):
    """Part "long": once the widened tuning has chosen, the 20-epoch runs' rows (every evaluated epoch, the
    training's loss terms beside the protocol's metrics) and two verdict scopes from the same runs, after 5 and
    after 20 epochs; the README's table is at the longest budget that has run."""
    from benchmarks.replication import plan

    results = tmp_path / "results"
    study = fake_study({"simclr": -0.05}, seeds=3)
    hyp = [r for r in study if r["method"] == "hypersolid"]
    simclr = [r for r in study if r["method"] == "simclr"]
    extra = []
    best = {"method.hypersolid.alpha=0.95", "method.simclr.temperature=0.05"}
    for run in plan.tune_runs():
        src = (hyp if run.method == "hypersolid" else simclr)[run.seed]
        final = {**src["final"], plan.TUNE_METRIC: 90.5 if run.overrides[0] in best else 80.5}
        extra.append(as_part({**src, "final": final}, run.name, "tune", run.overrides))
    for src, knob in ((hyp, "method.hypersolid.alpha=0.95"), (simclr, "method.simclr.temperature=0.05")):
        for r in src:
            terms = {"train.loss": 1.0 / r["seed"] if r["seed"] else 2.0, "train.alignment": 0.1 * (r["seed"] + 1)}
            per_epoch = [{**r["final"], "epoch": e, **terms} for e in plan.LONG_EVAL_EPOCHS]
            name = f"cpu-long-{r['method']}-{knob.split('.')[-1].replace('=', '')}-s{r['seed']}"
            extra.append(as_part(r, name, "long", (knob,), epochs=20, per_epoch=per_epoch, final=per_epoch[-1]))
            # The trainer's epoch records: every epoch whole, but one run's epoch 2 recorded over its last 136 steps.
            cut = r["method"] == "simclr" and r["seed"] == 2
            steps = {e: 136 if cut and e == 2 else 468 for e in range(1, 21)}
            extra[-1]["train_per_epoch"] = [{"epoch": e, "step": 468 * e, "steps": n} for e, n in steps.items()]
    write_runs(results, [*study, *extra])
    text, _files, summary, readme = report.render(results, tmp_path)
    assert summary["tuned"] == {"hypersolid": 0.95, "simclr": 0.05}
    rows = [line for line in text.splitlines() if line.startswith("| Hypersolid α 0.95 (tuned) | ")]
    assert [line.split(" | ")[1] for line in rows] == ["1", "2", "5", "10", "20"]
    header = next(line for line in text.splitlines() if line.startswith("| setting | epoch |") and "(train)" in line)
    col = header.split(" | ").index("alignment (train)")
    assert rows[0].split(" | ")[col].startswith("0.200 [")  # the training's own term, measured (seeds 0-2)
    assert "cpu_long_curves.png" in text
    # An evaluated epoch whose training means cover part of it is named, with the steps recorded; no other.
    partial = next(line for line in text.splitlines() if line.startswith("Training columns over part of an epoch"))
    cut = next(r["run"] for r in extra if r["part"] == "long" and r["method"] == "simclr" and r["seed"] == 2)
    assert f"(steps recorded): {cut} epoch 2: 136 of 468. " in partial
    long = {r["short"] for r in summary["verdicts"] if "of 20 epochs" in r["short"]}
    assert long == {"5 of 20 epochs, widened tuning", "20 of 20 epochs, widened tuning"}
    at20 = [r for r in summary["verdicts"] if r["short"] == "20 of 20 epochs, widened tuning"]
    assert any(r["verdict"] in {"holds here", "does not hold here", "inconclusive here"} for r in at20)
    block = readme.split(report.README_START)[-1]
    assert "| 20 of 20 epochs, widened tuning: mean" in block
    # With one 20-epoch run a method, nothing there can be judged: the README stays at the longest budget
    # that judges something (here the 1-epoch study; in the committed study the 5-epoch one).
    for path in results.rglob("cpu-long-*-s[12].json"):
        path.unlink()
    _text, _files, summary, readme = report.render(results, tmp_path)
    block = readme.split(report.README_START)[-1]
    assert "of 20 epochs" not in block and "| 1 epoch, defaults: mean" in block, block


def test_the_hdbscan_diagnosis_section_shows_what_hdbscan_did(tmp_path):
    """Amendment 3: the diagnosed checkpoints' grid rows become the paper-setting table (clusters, noise, largest
    cluster, AMI per method and feature kind), the sweep over min_cluster_size and an appendix of every row."""
    from benchmarks.replication import diagnosis

    lines, text = diagnosis.diagnosis_lines([], tmp_path / "d.md", lambda p: p.name)
    assert "Not run yet" in "\n".join(lines) and text == ""

    def rows(clusters: int, noise: float) -> list[dict]:
        out = []
        for pc, norm, metric, sel, mcs in (
            (50, "raw", "euclidean", "eom", 5),
            (200, "raw", "cosine", "eom", 10),
            (200, "centred", "cosine", "eom", 10),
        ):
            out.append(
                {
                    "per_class": pc,
                    "n": pc * 10,
                    "norm": norm,
                    "metric": metric,
                    "selection": sel,
                    "min_cluster_size": mcs,
                    "min_samples": mcs,
                    "n_clusters": clusters,
                    "noise_fraction": noise,
                    "largest_fraction": 0.8 if clusters == 3 else 0.5,  # Hypersolid: one cluster holds most
                    "nmi": 0.3,
                    "ami": 0.3 if clusters == 12 else 0.2,  # SwAV's the highest
                    "ari": 0.1,
                    "sizes": [250, 40],
                    "sizes_rest": 3,
                }
            )
        return out

    runs = []
    for s in range(2):
        for name, method, part, clusters in (
            (f"cpu-diag-long-hypersolid-alpha0.9-s{s}", "hypersolid", "diag", 3),
            (f"cpu-diag-random-s{s}", "hypersolid", "diag", 6 + s),
            (f"cpu-long-swav-default-s{s}", "swav", "long", 12),
        ):
            grid = {k: {"step": 1, "rows": rows(clusters, 0.2)} for k in ("backbone", "projector")}
            runs.append({"run": name, "method": method, "part": part, "seed": s, "hdbscan_grid": grid})
    lines, text = diagnosis.diagnosis_lines(runs, tmp_path / "d.md", lambda p: p.name)
    body = "\n".join(lines)
    assert "| backbone | Hypersolid | 3 [3, 3] (n = 2) | 0.200 [0.200, 0.200] (n = 2) |" in body
    assert "| backbone | random init | 6.500 [0.147, 12.85] (n = 2) |" in body and "| projector | SwAV | 12" in body
    assert "| features | method | mcs 10 |" in body  # the sweep's settings only
    assert "| backbone centred | Hypersolid | 3.0 / 0.20 / 0.200 |" in body
    # What the paper's setting shows, in words, from the table's means.
    assert (
        "backbone features: fewer clusters than the 10 classes: Hypersolid, random init (Hypersolid 3.0, random "
        "init 6.5, SwAV 12.0); one cluster holds more than half of the subsample for Hypersolid; the highest AMI is "
        "SwAV's (0.300)"
    ) in body
    seed0, _ = diagnosis.diagnosis_lines(runs[:3], tmp_path / "d.md", lambda p: p.name)
    one = "backbone features (one seed so far: Hypersolid, random init, SwAV): fewer clusters than the 10 classes"
    assert one in "\n".join(seed0)
    assert "[d.md](d.md)" in body and text.count("| cpu-") == 2 * 3 * 2 * 3  # runs x kinds x rows
    assert "| 250, 40 + 3 |" in text


def test_the_100_epoch_part_judges_each_stage_once_two_seeds_reach_it():
    """Amendment 3: the 100-epoch runs' rows and verdict scopes (after 50 and after 100 epochs); a run paused at
    epoch 50 counts there and nowhere later; a scope is judged once both methods have two seeds at its epoch."""
    from benchmarks.replication import curve100

    tuned = {"hypersolid": 0.9, "simclr": 0.1}
    runs = []
    for r in fake_study({"simclr": -0.05}, seeds=3):
        if r["method"] not in ("hypersolid", "simclr"):
            continue
        knob = "method.hypersolid.alpha=0.9" if r["method"] == "hypersolid" else "method.simclr.temperature=0.1"
        epochs = (20, 50) if r["seed"] < 2 else (20,)  # seeds 0-1 paused at 50, seed 2 not there yet
        per_epoch = [{**r["final"], "epoch": e} for e in epochs]
        runs.append(
            {**r, "part": "curve100", "overrides": [knob], "epochs": 100, "complete": False, "per_epoch": per_epoch}
        )
    fifty, hundred = curve100.curve100_scopes(runs, tuned)
    assert fifty.cmp is not None and set(fifty.cmp.values["simclr"][f"{BB}kmeans.ami"]) == {0, 1}
    assert hundred.cmp is None and "reached epoch 100" in hundred.missing
    rows = judging.verdicts([fifty, hundred])
    km = [r["verdict"] for r in rows if r["claim"] == KMEANS]
    assert km == ["holds here", "not testable here"]  # SimCLR 0.05 below at both paired seeds
    # Amendment 4: each run's epoch 20 beside the 20-epoch run of its settings and seed (here seed 0 of Hypersolid,
    # equal but for one metric).
    twin = next(r for r in runs if r["method"] == "hypersolid" and r["seed"] == 0)
    at20 = {**twin["per_epoch"][0], f"{BB}kmeans.ami": -1.0}
    long = [{**twin, "run": "cpu-long-hypersolid-alpha0.9-s0", "part": "long", "per_epoch": [at20]}]
    n = sum(k.startswith("protocol.") for k in at20)
    assert curve100.same_as_long(runs, long) == [
        f"{twin['run']} equals cpu-long-hypersolid-alpha0.9-s0's epoch 20 on {n - 1} of {n} metrics"
    ]
    assert "why a pair differs is under it): no run has reached it yet." in "\n".join(
        curve100.curve100_lines(runs, tuned)
    )
    text = "\n".join(curve100.curve100_lines(runs, tuned, long))
    assert f"is under it): {twin['run']} equals cpu-long-hypersolid-alpha0.9-s0's epoch 20 on {n - 1} of" in text
    assert "* Hypersolid α 0.9 (the paper's, also the tuned one): 3 at epoch 20, 2 at epoch 50, 0 at epoch 100" in text
    assert [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| SimCLR")] == ["20", "50"]


def test_the_readme_picks_its_best_baseline_among_those_with_two_seeds():
    """A baseline whose first seed has just landed is not "best" on that one number against another's mean of
    three: the README names it with its seeds, shows the best of those compared on two seeds or more, and says
    that no claim can hold before it is compared (a claim holds against every baseline)."""
    from benchmarks.replication import readme

    knn = README_METRICS[0][0]
    runs = [r for r in fake_study({}, seeds=3) if r["method"] in ("hypersolid", "simclr", "swav")]
    runs = [r for r in runs if r["method"] != "swav" or r["seed"] == 0]
    for r in runs:
        r["final"][knn] = 90.0 if r["method"] == "swav" else 80.0
    scope = judging.Scope("20 of 20 epochs", "after 20 epochs", judging.compare(runs))
    block = readme.readme_block(scope, {}, [], [])
    table = [line for line in block.splitlines() if line.startswith("| ")]
    assert "\n* **Holds**: none. None can until SwAV has two seeds.\n" in block  # a claim needs every baseline
    assert table[2].startswith(
        "| SimCLR (the only baseline with two seeds or more at this budget; not compared yet, fewer than two "
        "seeds: SwAV (1)) | 80 ["
    ), table[2]
    # With its second seed it is compared, and the best of the two.
    runs.append({**runs[-1], "seed": 1, "run": "cpu-swav-s1"})
    scope = judging.Scope("20 of 20 epochs", "after 20 epochs", judging.compare(runs))
    block = readme.readme_block(scope, {}, [], [])
    table = [line for line in block.splitlines() if line.startswith("| ")]
    assert "\n* **Holds**: none.\n" in block
    assert table[2].startswith("| SwAV (best by kNN@5 of the baselines run here: SimCLR, SwAV) | 90 ["), table[2]


def test_the_run_table_counts_a_resumed_runs_training_over_its_attempts() -> None:
    """A run trained in two attempts: its training seconds are both attempts' (train_s_attempts), not the last
    one's (train_s_total); a result without the field (older runs) falls back to the last attempt's."""
    from benchmarks.replication.tables import run_table

    resumed = {**fake_run("hypersolid", 0, {}), "train_s_total": 10.0, "train_s_attempts": 30.0}
    older = {**fake_run("simclr", 0, {}), "train_s_total": 7.0}
    rows = {line.split(" | ")[0]: line.split(" | ")[3] for line in run_table([resumed, older])[2:]}
    assert rows == {"| Hypersolid": "30", "| SimCLR": "7"}
