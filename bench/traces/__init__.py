"""Request traces: the JSONL format and its packed cache, and the builders (ShareGPT, agent,
synthetic families, SGLang's generated shared prefix, SGLang's agentic-trace JSON)."""
