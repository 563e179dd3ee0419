"""Engine integrations: code that puts dsv4 inside an inference engine (today vLLM's CPU path)."""
