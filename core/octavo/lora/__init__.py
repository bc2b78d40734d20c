"""Multi-LoRA serving: PEFT adapters (``adapter``), the shrink/expand ops (``ops``), the
wrapper that adds an adapter's delta to any linear method (``layers``) and the worker's
adapter slots (``manager``). See docs/lora.md."""
