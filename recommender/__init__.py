"""koord-recommender's domain core: units, workload identity, the four-line resource model, policy, settings.

The core imports nothing else of ours, so models, pipelines and serving can all share it.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("koord-recommender")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
