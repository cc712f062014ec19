"""The RULER-style long-context probe of protocol sec. 13: seeded offline items (``items``)."""
