"""The `recommender` command: the composition root, the one package that wires the layers together (settings from
the environment and flags into the pipelines, the service and the controllers). Nothing imports it."""
