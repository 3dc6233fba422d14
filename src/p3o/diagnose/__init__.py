"""Off-policy diagnosis around any trainer: before training (``p3o mismatch``: how far a rollout engine is from the
fp32 trainer) and after or during it (``p3o doctor``: findings from a run's metrics). During training,
:class:`p3o.monitor.OffPolicyMonitor` computes the statistics both read.

* :mod:`p3o.diagnose.mismatch` — ``p3o mismatch --model M [--engine hf|vllm] [--precision ...]``;
* :mod:`p3o.diagnose.doctor` — ``p3o doctor PATH`` (exit 0 healthy, 1 a finding fired, 2 bad input).
"""
