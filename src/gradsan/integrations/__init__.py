"""Training-loop integrations: ``gradsan.integrations.optax`` (a GradientTransformation),
``gradsan.integrations.torch_hook`` (GradGuard for a plain loop) and
``gradsan.integrations.lightning`` (a Lightning Callback). Each imports its framework only
when imported itself."""
