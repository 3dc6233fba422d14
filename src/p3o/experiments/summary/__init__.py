"""The summary room: the results pages rendered from the verdict files that ``p3o compare`` writes — every verdict
of every study with one Holm family over the confirmatory ones (:mod:`~p3o.experiments.summary.pages`), and the
generated blocks of hand-written pages (:mod:`~p3o.experiments.summary.blocks`). ``python -m
p3o.experiments.summary`` runs :func:`p3o.experiments.summary.pages.main`."""
