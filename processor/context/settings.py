"""The ``context_cache`` key of a model_config: the context part's results kept across requests.

```json
"context_inputs": ["user_seq", "user_profile", "user_dense"],
"context_cache": {"max_entries": 10000, "ttl_ms": 60000}
```

``max_entries`` (required): the most contexts kept (least recently used dropped first);
``ttl_ms`` (optional): an entry older than this is not served (None: no age limit). Types are
strict; a wrong key or value is a ConfigError naming ``context_cache.<key>``. It needs
``context_inputs`` (it keeps what the declared context part computes). Immutable.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class ContextCacheConfig(BaseModel):
    """One model's context cache settings. See the module doc."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_entries: StrictInt = Field(ge=1, le=1 << 24)
    ttl_ms: StrictInt | None = Field(None, ge=1, le=7 * 86_400_000)
