"""The project's tools (docs/dev.md, "Scripts and tools"): importable so that their tests import them."""
