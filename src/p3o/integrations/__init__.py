"""Plug-ins that bring p3o's objectives (P3O, MinPRO, M2PO and the baselines) to other RL frameworks.

* :mod:`p3o.integrations.trl` — ``P3OGRPOTrainer``, a TRL ``GRPOTrainer`` whose policy loss is any p3o objective
  (extra ``trl``).
* :mod:`p3o.integrations.verl` — registers the objectives with verl's ``register_policy_loss`` so that
  ``actor_rollout_ref.actor.policy_loss.loss_mode=p3o`` works (extra ``verl``).

Neither framework is imported here; each sub-module imports its own and says which extra to install.
See docs/integrations.md.
"""
