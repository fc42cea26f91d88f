"""chargen's version: what a run's config.json records as the chargen that wrote it."""

__version__ = "0.1.0"
