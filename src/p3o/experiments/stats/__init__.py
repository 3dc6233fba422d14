"""The statistics room: how a claim is decided. Paired-by-seed intervals, TOST and Holm
(:mod:`~p3o.experiments.stats.paired`), verdicts of declared claims for any instrument
(:mod:`~p3o.experiments.stats.verdicts`), and pre-registration — a study file committed before its confirmatory
runs, fresh seeds (:mod:`~p3o.experiments.stats.prereg`)."""
