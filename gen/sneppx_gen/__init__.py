"""sneppx-gen: renders the sneppx kernel templates (aot and jit) and the runtime tables."""
