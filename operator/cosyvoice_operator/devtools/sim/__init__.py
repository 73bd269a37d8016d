"""The autoscaling simulator behind ``cosyvoice-operator sim`` (issue 10).

A functional core, one concept a module:

- `trace`: traffic (CSV traces, time splits, load multipliers, steps/ramps/bursts, the
  synthesized diurnal day, Prometheus outages);
- `plant`: Triton pods (slots, FIFO queue, cold start, drain) and the Prometheus that
  scrapes them (scrape interval, rate windows, completion-time counters, outages);
- `hpa`, `kpa`: Kubernetes' HPA and a Knative KPA style decider, from their documentation;
- `policies`: the controllers compared, ours being `cosyvoice_operator.autoscaling.policy`
  itself, unchanged;
- `engine`: one policy on one trace, and what it measures;
- `experiment`: sweeps, selection on a training trace, evaluation, the table and the JSON;
- `plot`, `command`: the picture and the command line.
"""
