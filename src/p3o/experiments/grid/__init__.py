"""The grid room: the language-model study. An experiment file (:mod:`~p3o.experiments.grid.spec`) names objectives
× regimes × seeds from one table of presets (:mod:`~p3o.experiments.grid.regimes`); the runner trains each run
resumably (:mod:`~p3o.experiments.grid.runner`); the analysis reads their curves
(:mod:`~p3o.experiments.grid.analysis`); the report aggregates them into tables, figures and verdicts
(:mod:`~p3o.experiments.grid.report`, :mod:`~p3o.experiments.grid.figures`); ``p3o compare`` drives it all
(:mod:`~p3o.experiments.grid.compare`)."""
