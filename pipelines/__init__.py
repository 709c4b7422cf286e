"""Offline pipelines: read usage, train the models, backtest, publish model versions."""
