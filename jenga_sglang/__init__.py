"""jenga-sglang: prefix caching and memory management for hybrid LLMs, as an SGLang extension.

Importing this package is cheap: it never imports torch or sglang. Those load only in
`jenga_sglang.pool.layout`, `jenga_sglang.binding` and `jenga_sglang.kernels`.
"""

from jenga_sglang.compiled import use_fresh_build

__version__ = "0.1.0"

use_fresh_build()  # a mypyc build is used only while it matches the sources (compiled.py)
