"""The SGLang binding: plugin entry point, flags, radix-cache backend, memory adapter, metrics.

This is the only package that imports sglang, and only inside functions or in modules that the
pure-Python paths never import (`options` and `slot_memory` stay sglang- and torch-free).
"""
