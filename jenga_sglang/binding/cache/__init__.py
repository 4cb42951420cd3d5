"""Our tree behind SGLang's `BasePrefixCache`: the backend and its factory, request plans and
namespaces, the capture slots' bookkeeping, the Mamba state hand-over, metrics, and what tensor
parallelism needs of it. Imports `slots` below it, never `capture` or `pools` above it."""
