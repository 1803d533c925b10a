"""Passage caches: each window's passage side (lower states, or ids at k = 0), computed once per
reader and k at `index` time, stored in a `Storage` scheme, read by row (the map:
`dil_jax.open_domain`)."""
